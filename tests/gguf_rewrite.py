"""Rewrite an honest GGUF with one change (drop or add a tensor, change or drop a key), through the sweep's editor."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.formats.ggml_types import ValueType
from tests.mutation import gguf_edit

_TYPES = ((bool, ValueType.BOOL), (int, ValueType.UINT32), (float, ValueType.FLOAT32), (str, ValueType.STRING))


def _kv(gguf: gguf_edit.GGUFFile, key: str, value: Any) -> gguf_edit.KV:
    existing = next((kv for kv in gguf.kvs if kv.key == key), None)
    if existing is not None:
        return replace(existing, value=value)
    vtype = next(vtype for kind, vtype in _TYPES if isinstance(value, kind))
    return gguf_edit.KV(key, vtype, value)


def rewrite(
    src: Path,
    dst: Path,
    *,
    drop: tuple[str, ...] = (),
    add: dict[str, np.ndarray] | None = None,
    set_keys: dict[str, Any] | None = None,
    drop_keys: tuple[str, ...] = (),
) -> Path:
    gguf = gguf_edit.read(src)
    if missing := [key for key in drop_keys if all(kv.key != key for kv in gguf.kvs)]:
        raise KeyError(f"{src.name} has no {missing}")
    gguf = replace(gguf, kvs=[kv for kv in gguf.kvs if kv.key not in drop_keys])
    for key, value in (set_keys or {}).items():
        gguf = gguf.with_kv(_kv(gguf, key, value))
    tensors = [t for t in gguf.tensors if t.name not in drop]
    for name, values in (add or {}).items():
        data = np.ascontiguousarray(values, dtype=np.float32)
        tensors.append(gguf_edit.Tensor(name, tuple(reversed(data.shape)), 0, data.tobytes()))
    return gguf_edit.write(gguf.with_tensors(tensors), dst)
