"""A Hugging Face model directory, read safely: config, safetensors shards, index, tokenizer.

Pickle checkpoints are refused without being opened. Shard headers are validated strictly, the
index must name exactly the tensors the shards hold, and a tensor name may appear only once
across shards. Every JSON side file is parsed and shape-checked when the source is opened
(`source_files`), so gates never meet a malformed one. Packed low-bit tensors are presented under
their logical name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

import numpy as np

from engine.errors import SourceError
from engine.formats import packed
from engine.formats.json_input import parse_json
from engine.formats.safetensors_strict import SafetensorsFile, read_safetensors, to_float32
from engine.formats.source_files import check_config, check_side_file, check_weight_map

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
INDEX_NAME = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class SourceTensor:
    """One logical source tensor: stored plainly or packed."""

    name: str
    dtype: str  # "F32", "F16", "BF16", ... or "PACKED<bits>"
    shape: tuple[int, ...]
    file: SafetensorsFile
    packing: packed.PackedSpec | None = None

    @property
    def is_float(self) -> bool:
        return self.packing is not None or self.dtype in ("F32", "F16", "BF16", "F64")

    def as_rows(self) -> np.ndarray:
        """Stored values as a 2-D array of rows (last dim is the row), memory-mapped when plain."""
        values = packed.decode(self.file, self.packing) if self.packing else self.file.array(self.name)
        return values.reshape(-1, self.shape[-1] if self.shape else 1)

    def widen(self, chunk: np.ndarray) -> np.ndarray:
        """Rows of `as_rows()` widened to contiguous float32 (exact for F16/BF16)."""
        values = chunk if self.packing else to_float32(chunk, self.dtype)
        return np.ascontiguousarray(values, dtype=np.float32)


@dataclass(frozen=True)
class SourceModel:
    root: Path
    config: Mapping[str, Any]
    tensors: Mapping[str, SourceTensor]
    files: tuple[Path, ...] = field(default=())
    # parsed side files: a real tokenizer.json is megabytes, and gate 1 reads it when the source is
    # opened and again for the tokenizer metadata; the gates also judge exactly what was checked at opening
    _parsed: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def read_json(self, relative: str) -> Any | None:
        """A JSON side file of the model directory, checked for its known shape, or None when absent.
        Parsed once per opened source; callers must not change the value."""
        if relative in self._parsed:
            return self._parsed[relative]
        path = _inside(self.root, relative.lstrip("/"), relative, "source.bad_file")
        if not path.is_file():
            return None
        value = parse_json(path.read_bytes(), relative)
        check_side_file(relative, value)
        self._parsed[relative] = value
        return value

    def read_text(self, relative: str) -> str | None:
        """A UTF-8 text side file (chat_template.jinja), or None when absent."""
        path = self.root / relative
        if not path.is_file():
            return None
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SourceError("source.bad_file", f"{relative} is not valid UTF-8") from exc


def _refuse_pickles(root: Path) -> None:
    unsafe = sorted(p.name for p in root.rglob("*") if p.suffix.lower() in PICKLE_SUFFIXES and p.is_file())
    if unsafe:
        raise SourceError("source.unsafe_format", f"pickle checkpoint(s) refused, never loaded: {', '.join(unsafe)}")


def _weight_map(index_path: Path) -> dict[str, str]:
    return check_weight_map(parse_json(index_path.read_bytes(), INDEX_NAME, "source.index_mismatch"), INDEX_NAME)


def _check_side_files(source: SourceModel) -> None:
    """Parse every side file a gate may read, so a malformed one is refused here, not in a gate."""
    for relative in ("tokenizer.json", "tokenizer_config.json", "config_sentence_transformers.json"):
        source.read_json(relative)
    for module in source.read_json("modules.json") or []:
        if str(module.get("type", "")).endswith("Pooling"):
            source.read_json(f"{module.get('path', '')}/config.json")
    source.read_text("chat_template.jinja")


def _inside(root: Path, relative: str, named_by: str, code: str) -> Path:
    """`root / relative`, refused when `relative` is absolute or climbs out with `..`: no name read
    from a model's own files may reach outside its directory (symlinks are the edge's check)."""
    pure = PurePosixPath(relative)
    if pure.is_absolute() or ".." in pure.parts or "\\" in relative:
        raise SourceError(code, f"{named_by} names {relative!r}, outside the model directory")
    return root / relative


def _shards(root: Path) -> list[Path]:
    index_path = root / INDEX_NAME
    shards = sorted(root.glob("*.safetensors"))
    if not index_path.is_file():
        return shards
    weight_map = _weight_map(index_path)
    named = sorted({_inside(root, shard, INDEX_NAME, "source.index_mismatch") for shard in weight_map.values()})
    missing = [p.name for p in named if not p.is_file()]
    if missing:
        raise SourceError("source.index_mismatch", f"{INDEX_NAME} names missing shards: {', '.join(missing)}")
    stray = sorted(p.name for p in set(shards) - set(named))
    if stray:
        raise SourceError("source.index_mismatch", f"shards not in {INDEX_NAME}: {', '.join(stray)}")
    return named


def _check_index(root: Path, owner: dict[str, str]) -> None:
    index_path = root / INDEX_NAME
    if not index_path.is_file():
        return
    weight_map = _weight_map(index_path)
    for name in sorted(set(weight_map) | set(owner)):
        if weight_map.get(name) != owner.get(name):
            raise SourceError(
                "source.index_mismatch",
                f"index puts {name!r} in {weight_map.get(name)!r}, the shards hold it in {owner.get(name)!r}",
                name,
            )


def _logical_tensors(file: SafetensorsFile) -> dict[str, SourceTensor]:
    specs = packed.packed_specs(file)
    parts = {f"{name}.{part}" for name in specs for part in packed.PACKED_PARTS}
    tensors = {
        name: SourceTensor(name, entry.dtype, entry.shape, file)
        for name, entry in file.entries.items()
        if name not in parts
    }
    for name, spec in specs.items():
        tensors[name] = SourceTensor(name, f"PACKED{spec.bits}", spec.shape, file, spec)
    return tensors


def open_source(root: Path) -> SourceModel:
    """Open and validate a Hugging Face model directory."""
    if not root.is_dir():
        raise SourceError("source.missing", f"{root} is not a directory")
    _refuse_pickles(root)
    config_path = root / "config.json"
    if not config_path.is_file():
        raise SourceError("source.missing", "config.json is missing")
    config = parse_json(config_path.read_bytes(), "config.json", "source.bad_config")
    if not isinstance(config, dict):
        raise SourceError("source.bad_config", "config.json is not a JSON object")
    check_config(config)
    shard_paths = _shards(root)
    if not shard_paths:
        raise SourceError("source.missing", "no .safetensors weights in the source directory")
    tensors: dict[str, SourceTensor] = {}
    owner: dict[str, str] = {}
    for path in shard_paths:
        file = read_safetensors(path)
        for name in file.entries:
            if name in owner:
                raise SourceError(
                    "source.duplicate_tensor", f"{name!r} is in both {owner[name]} and {path.name}", name
                )
            owner[name] = path.name
        tensors.update(_logical_tensors(file))
    _check_index(root, owner)
    source = SourceModel(root, MappingProxyType(config), MappingProxyType(tensors), tuple(shard_paths))
    _check_side_files(source)
    return source
