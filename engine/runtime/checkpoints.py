"""Where a reference model's weights are read from, a few tensors (or rows) at a time: the `Checkpoint`
protocol and the source's safetensors behind it (one file or a sharded index). The artifact's own
tensors are the other implementation (`engine/runtime/artifact_weights.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

from engine.formats.json_input import parse_json
from engine.formats.safetensors_strict import SafeTensorEntry, read_safetensors
from engine.runtime.read_ahead import READ_AHEAD

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"


class Checkpoint(Protocol):
    """Named tensors a reference model is loaded from, read a few at a time."""

    def names(self) -> list[str]: ...

    def shape(self, key: str) -> tuple[int, ...]: ...

    def read(self, keys: Sequence[str]) -> dict[str, Any]:
        """The tensors, floating point ones as float32 (integer buffers keep their type)."""
        ...

    def read_rows(self, key: str, rows: Sequence[int]) -> Any:
        """Rows `rows` (ascending, distinct) of a 2-D floating point tensor, as float32: exactly those rows
        of `read([key])[key]`, without reading the others."""
        ...

    def prefetch(self, keys: Sequence[str]) -> None:
        """A hint that `keys` are read next: their bytes start coming into the page cache now, and the call
        returns at once (`engine/runtime/read_ahead.py`)."""
        ...


def checkpoint_index(source_dir: Path) -> dict[str, Path] | None:
    """Checkpoint key -> the safetensors file holding it (one file or a sharded index); None when the
    source has no safetensors (transformers would then read a pickle, which cannot be streamed)."""
    from safetensors import safe_open

    index_file = source_dir / SHARD_INDEX
    if index_file.is_file():
        index = parse_json(index_file.read_bytes(), SHARD_INDEX)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            return None  # not a shard list: left to from_pretrained's own checks
        names = {str(k): name for k, name in weight_map.items() if isinstance(name, str) and Path(name).name == name}
        return {key: source_dir / name for key, name in names.items()} if len(names) == len(weight_map) else None
    single = source_dir / SINGLE_FILE
    if not single.is_file():
        return None
    with safe_open(str(single), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


class SafetensorsCheckpoint:
    """The source's safetensors. Each file is opened for one read only: once the handle is closed the
    mapping lives only as long as the tensors, so the file-backed pages counted in the process RSS are
    released with the module's weights. A float32 tensor stays a view of the file's private mapping, as
    from_pretrained leaves it (no copy); another dtype is cast into a new float32 tensor."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self._entries: dict[Path, dict[str, SafeTensorEntry]] = {}  # each file's header, parsed on first prefetch

    def names(self) -> list[str]:
        return list(self.files)

    def shape(self, key: str) -> tuple[int, ...]:
        from safetensors import safe_open

        with safe_open(str(self.files[key]), framework="pt") as handle:
            return tuple(handle.get_slice(key).get_shape())

    def read(self, keys: Sequence[str]) -> dict[str, Any]:
        import torch
        from safetensors import safe_open

        out: dict[str, Any] = {}
        with ExitStack() as stack:
            handles: dict[Path, Any] = {}
            for key in keys:
                if self.files[key] not in handles:
                    handles[self.files[key]] = stack.enter_context(safe_open(str(self.files[key]), framework="pt"))
                tensor = handles[self.files[key]].get_tensor(key)
                out[key] = tensor.to(torch.float32) if tensor.is_floating_point() else tensor
        return out

    def read_rows(self, key: str, rows: Sequence[int]) -> Any:
        import torch
        from safetensors import safe_open

        with safe_open(str(self.files[key]), framework="pt") as handle:
            stored = handle.get_slice(key)
            parts = [stored[start:stop] for start, stop in runs(rows)]  # one read per run of adjacent rows
        return torch.cat(parts).to(torch.float32)


    def prefetch(self, keys: Sequence[str]) -> None:
        for key in keys:
            path = self.files[key]
            if path not in self._entries:
                self._entries[path] = dict(read_safetensors(path).entries)
            entry = self._entries[path][key]
            READ_AHEAD.ask(str(path), entry.start, entry.nbytes)


def runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending distinct row numbers as [start, stop) ranges of adjacent rows."""
    found: list[tuple[int, int]] = []
    for row in rows:
        if found and found[-1][1] == row:
            found[-1] = (found[-1][0], row + 1)
        else:
            found.append((row, row + 1))
    return found


def source_checkpoint(source_dir: Path) -> SafetensorsCheckpoint | None:
    files = checkpoint_index(source_dir)
    return None if files is None else SafetensorsCheckpoint(files)
