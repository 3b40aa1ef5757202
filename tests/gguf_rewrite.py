"""Rewrite an honest GGUF with one change (drop or add a tensor, change a key), using gguf-py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def rewrite(
    src: Path,
    dst: Path,
    *,
    drop: tuple[str, ...] = (),
    add: dict[str, np.ndarray] | None = None,
    set_keys: dict[str, Any] | None = None,
) -> Path:
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    overrides = set_keys or {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        value = overrides.get(name, field.contents())
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        if tensor.name in drop:
            continue
        data = np.asarray(tensor.data)
        writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
    for name, values in (add or {}).items():
        writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
