"""The files one artifact is, read as one GGUF: a single file, or the shards of a gguf-split.

A split is named by its first shard (`model-00001-of-00003.gguf`), as llama.cpp is given it; its
siblings are the files that name implies, beside it (`gguf_split.discover_shards`). Gate 1 and the
reference built from the artifact's own weights see one layout and one byte space: the shards' bytes
laid end to end, each tensor's offset moved by the sizes of the shards before its own. A tensor never
spans two shards (each shard is a whole GGUF file), so a read is always one slice of one memory map,
and no shard is ever copied or merged on disk.

The union layout carries the first shard's metadata without the `split.*` keys: those describe the
files, not the model, and `read_split` has already checked every one of them.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Literal, overload
from urllib.parse import urlsplit

import numpy as np

from engine.blockers import Blocker
from engine.formats.gguf_split import MAX_SHARDS, SPLIT_KEYS, SplitArtifact, discover_shards, read_split, shard_name
from engine.formats.gguf_structure import GGUFLayout, GGUFStructureError, read_layout


def artifact_paths(first: Path) -> tuple[Path, ...]:
    """Every file of the artifact named by `first`: its shards in order for a split, else `(first,)`."""
    name = shard_name(first)
    return discover_shards(first) if name is not None and name.count > 1 else (first,)


def _bases(layouts: Sequence[GGUFLayout]) -> list[int]:
    """Where each shard starts in the artifact's one byte space."""
    bases, end = [], 0
    for layout in layouts:
        bases.append(end)
        end += layout.file_size
    return bases


def union_layout(split: SplitArtifact) -> GGUFLayout:
    """The split as one layout (see the module docstring); only for a split without blockers."""
    layouts = [layout for layout in split.layouts if layout is not None]
    if not split.ok or len(layouts) != len(split.paths):
        raise ValueError("a split with blockers has no union layout")
    bases = _bases(layouts)
    tensors = tuple(dataclasses.replace(held.info, offset=bases[held.shard] + held.info.offset)
                    for held in split.tensors.values())
    first = layouts[0]
    metadata = MappingProxyType({key: value for key, value in first.metadata.items() if key not in SPLIT_KEYS})
    return GGUFLayout(path=first.path, version=first.version, alignment=first.alignment, metadata=metadata,
                      tensors=tensors, data_offset=first.data_offset,
                      file_size=sum(layout.file_size for layout in layouts))


def read_artifact(first: Path) -> GGUFLayout | tuple[Blocker, ...]:
    """The artifact's layout, or every blocker that keeps it from being one model.

    A single file keeps `read_layout`'s behaviour (its one `gguf.*` defect) except that split keys on it
    are checked too: a file that says it is one shard of several cannot be loaded alone."""
    paths = artifact_paths(first)
    if len(paths) == 1:
        try:
            layout = read_layout(first)
        except GGUFStructureError as exc:
            return (Blocker(code=exc.code, gate="storage", why=exc.why, tensor=exc.tensor),)
        if not any(key in layout.metadata for key in SPLIT_KEYS):
            return layout
    split = read_split(paths)
    if not split.ok:
        return split.blockers
    return union_layout(split) if len(paths) > 1 else split.layouts[0] or split.blockers


def artifact_layout(first: Path) -> GGUFLayout:
    """The layout of an artifact already accepted by `read_artifact` (a pool process re-reading it)."""
    found = read_artifact(first)
    if isinstance(found, tuple):
        raise ValueError(f"{first.name} is no longer a readable artifact: {found[0].why}")
    return found


class ShardedBytes:
    """The shards' bytes as one address space, each shard memory-mapped; what a single file's `np.memmap`
    is to the code that slices tensors out of it. `mode="c"` maps copy-on-write, as the negative controls
    need: a planted byte changes one private page, never a file."""

    def __init__(self, paths: Sequence[Path], mode: Literal["r", "c"] = "r") -> None:
        self.maps = [np.memmap(path, dtype=np.uint8, mode=mode) for path in paths]
        self.bases = [0]
        for mapped in self.maps[:-1]:
            self.bases.append(self.bases[-1] + mapped.size)
        self.size = self.bases[-1] + self.maps[-1].size

    def _locate(self, position: int) -> tuple[np.memmap, int]:
        if not 0 <= position < self.size:
            raise IndexError(f"byte {position} is outside the artifact's {self.size} bytes")
        shard = bisect.bisect_right(self.bases, position) - 1
        return self.maps[shard], position - self.bases[shard]

    @overload
    def __getitem__(self, key: int) -> np.uint8: ...
    @overload
    def __getitem__(self, key: slice) -> np.ndarray: ...

    def __getitem__(self, key: int | slice) -> np.uint8 | np.ndarray:
        if isinstance(key, int):
            mapped, offset = self._locate(key)
            return mapped[offset]
        start, stop = key.start or 0, key.stop if key.stop is not None else self.size
        if key.step not in (None, 1) or stop <= start:
            raise IndexError("a tensor is one contiguous, non-empty range of bytes")
        mapped, offset = self._locate(start)
        if offset + (stop - start) > mapped.size:
            raise IndexError(f"bytes {start}..{stop} span two shards; no tensor does")
        return mapped[offset:offset + (stop - start)]

    def __setitem__(self, key: int, value: int | np.integer) -> None:
        mapped, offset = self._locate(key)
        mapped[offset] = value


    def file_range(self, position: int) -> tuple[str, int]:
        """The shard file holding byte `position` of the artifact, and the byte's offset in it."""
        mapped, offset = self._locate(position)
        return str(mapped.filename), offset


ArtifactBytes = np.ndarray | ShardedBytes


def file_range(file_bytes: ArtifactBytes, position: int) -> tuple[str, int] | None:
    """Which file (and where in it) holds byte `position` of the artifact; None for bytes no file backs."""
    if isinstance(file_bytes, ShardedBytes):
        return file_bytes.file_range(position)
    if isinstance(file_bytes, np.memmap) and file_bytes.filename is not None:
        return str(file_bytes.filename), file_bytes.offset + position
    return None


def artifact_bytes(first: Path, mode: Literal["r", "c"] = "r") -> ArtifactBytes:
    """The artifact's bytes, in the byte space `read_artifact`'s tensor offsets are in."""
    paths = artifact_paths(first)
    if len(paths) == 1:
        return np.memmap(first, dtype=np.uint8, mode=mode)
    return ShardedBytes(paths, mode)


def sibling_uri(uri: str, name: str) -> str:
    """`uri` with its last path segment replaced by `name` (a shard's sibling), its query kept: where
    llama.cpp's naming puts the other shards of a split published under one prefix."""
    head, separator, query = uri.partition("?")
    return f"{head.rsplit('/', 1)[0]}/{name}{separator}{query}"


def split_shard_uris(first_uri: str, count: int) -> list[str]:
    """The URIs of shards 2..`count` of the split whose first shard is at `first_uri` (none for one file;
    never more than its name says it has)."""
    name = shard_name(PurePosixPath(urlsplit(first_uri).path))
    if count < 2 or name is None:
        return []
    return [sibling_uri(first_uri, name.sibling(number)) for number in range(2, min(count, name.count) + 1)]


def uri_name(uri: str) -> str:
    """The last path segment of a URI (its query and fragment dropped)."""
    return PurePosixPath(urlsplit(uri).path).name


def other_shards_in(first_uri: str, uris: Sequence[str]) -> list[int]:
    """Where shards 2..n of the split whose first shard is at `first_uri` are in `uris`: a report's files
    after the artifact, which the engine lists first (none for one file)."""
    siblings = {uri_name(uri) for uri in split_shard_uris(first_uri, MAX_SHARDS)}
    return [position for position, uri in enumerate(uris[:len(siblings)]) if uri_name(uri) in siblings]
