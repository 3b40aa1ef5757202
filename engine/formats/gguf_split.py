"""A gguf-split artifact (`model-00001-of-00003.gguf`, ...) read and validated as one model.

Large GGUF releases are published as shards written by llama.cpp's `gguf-split` (or gguf-py's
`GGUFWriter(split_max_tensors=...)`). Each shard is a complete GGUF file carrying `split.no` (u16,
0-based), `split.count` (u16) and `split.tensors.count` (i32, the total over all shards). The first
shard holds the model's metadata; every shard holds its own tensors' infos and data. llama.cpp,
given the first shard, derives the other file names from the first one's `-00001-of-0000n.gguf`,
refuses a shard whose `split.no` is not its position, a tensor name seen twice, and a union whose
size is not `split.tensors.count`, and reads metadata from the first shard only.

This module names each of those defects as a blocker *before* llama.cpp is involved, and builds the
union view gate 1 needs (tensor name -> shard and tensor info). Every shard first goes through our
bounded structural parser (`read_layout`), exactly as a single-file artifact does; a structural
defect in one shard keeps its `gguf.*` code. Nothing here is wired into the gates yet: it is
additive, and a single-file artifact never reaches it.

What "another split" means here: the GGUF format ties shards together by nothing but their
`split.*` counts and file names, so a shard belongs to the split of the shards before it when every
metadata key that both carry (except `split.no`, which differs by design, and `general.alignment`,
a property of each file's layout) has the same value, bit for bit. That covers a differing
`split.count` or `split.tensors.count`, and a different `general.architecture`, `general.name`, etc.
when the shards repeat them. A shard from another release of the same size whose only keys are the
`split.*` ones (what gguf-split writes after the first) is indistinguishable here; its tensors
then fail gate 1's value comparison with the source, and the release digests pin which bytes were
measured.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from engine.blockers import Blocker
from engine.errors import UsageError
from engine.formats.gguf_structure import GGUFArray, GGUFLayout, GGUFStructureError, TensorInfo, read_layout

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS_COUNT = "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT)
# Keys a shard may legitimately carry with a value of its own.
PER_SHARD_KEYS = frozenset({SPLIT_NO, "general.alignment"})
MAX_SHARDS = 0xFFFF  # split.count is a u16 in llama.cpp
MAX_SPLIT_TENSORS = (1 << 31) - 1  # split.tensors.count is an i32
# llama.cpp's llama_split_path: "%s-%05d-of-%05d.gguf", numbered from 1. gguf-py's SHARD_NAME_FORMAT agrees.
SHARD_NAME = re.compile(r"^(?P<prefix>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$")
GATE = "storage"  # a split is gate 1's input; its defects block like structural ones


@dataclass(frozen=True, slots=True)
class ShardName:
    """What a shard's file name says: `<prefix>-<number>-of-<count>.gguf`, `number` counted from 1."""

    prefix: str
    number: int
    count: int

    def sibling(self, number: int) -> str:
        """The file name of shard `number` (from 1) of the same split, as llama.cpp builds it."""
        return f"{self.prefix}-{number:05d}-of-{self.count:05d}.gguf"


class SplitTensor(NamedTuple):
    """Where a tensor of the union lives: `shard` is its position in `SplitArtifact.paths` (0-based)."""

    shard: int
    info: TensorInfo


@dataclass(frozen=True, slots=True)
class SplitArtifact:
    """The shards of one split read as one model.

    `layouts[i]` is shard i's validated layout, or None when the file is absent or structurally
    invalid (a blocker says which). `tensors` is the union over the shards that belong to the split,
    first occurrence winning. The artifact is usable by gate 1 only when `blockers` is empty.
    """

    paths: tuple[Path, ...]
    layouts: tuple[GGUFLayout | None, ...]
    tensors: Mapping[str, SplitTensor]
    blockers: tuple[Blocker, ...]

    @property
    def ok(self) -> bool:
        return not self.blockers

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The model's metadata: the first shard's, the only one llama.cpp reads (empty when it is unusable)."""
        first = self.layouts[0] if self.layouts else None
        return first.metadata if first is not None else MappingProxyType({})

    def tensor(self, name: str) -> SplitTensor:
        return self.tensors[name]

    def layout_of(self, name: str) -> GGUFLayout:
        """The layout of the shard holding tensor `name` (its `TensorInfo.offset` is within that file)."""
        layout = self.layouts[self.tensors[name].shard]
        assert layout is not None  # the union only holds tensors of readable shards
        return layout


def shard_name(path: PurePath) -> ShardName | None:
    """What `path`'s name says about its place in a split, or None if it is not a shard name."""
    match = SHARD_NAME.match(path.name)
    if match is None:
        return None
    return ShardName(match["prefix"], int(match["number"]), int(match["count"]))


def discover_shards(first: Path) -> tuple[Path, ...]:
    """Every shard path `first`'s name implies, in order, beside it: what llama.cpp would open.

    No file is opened or checked for existence: `read_split` reports absent shards as blockers,
    so a missing shard is named instead of silently shortening the list. A name that is not a
    shard name gives `(first,)`, a single-file artifact (whose `split.count`, if any, `read_split`
    still checks). Any shard's name works, not only the first's: numbering restarts at 00001.
    """
    name = shard_name(first)
    if name is None or not 1 <= name.count <= MAX_SHARDS:
        return (first,)
    return tuple(first.with_name(name.sibling(number)) for number in range(1, name.count + 1))


def read_split_from_first(first: Path) -> SplitArtifact:
    """`read_split` over the shards `first`'s name implies (see `discover_shards`)."""
    return read_split(discover_shards(first))


@dataclass(frozen=True, slots=True)
class _Facts:
    """A shard's split keys, range-checked."""

    number: int  # split.no
    count: int  # split.count
    total: int  # split.tensors.count


def _shard_label(position: int, path: Path) -> str:
    return f"shard {position + 1} ({path.name})"


def _open(position: int, path: Path) -> GGUFLayout | Blocker:
    label = _shard_label(position, path)
    if not path.is_file():
        return Blocker(code="artifact.split_missing_shard", gate=GATE, why=f"{label} does not exist")
    try:
        return read_layout(path)
    except GGUFStructureError as exc:
        return Blocker(code=exc.code, gate=GATE, why=f"{label}: {exc.why}", tensor=exc.tensor)


def _int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _facts(position: int, path: Path, layout: GGUFLayout, alone: bool) -> _Facts | Blocker:
    """The shard's split keys; a file without any is a single-file model, a shard only when `alone`."""
    metadata = layout.metadata
    label = _shard_label(position, path)
    present = [key for key in SPLIT_KEYS if key in metadata]
    if not present:
        if alone:
            return _Facts(0, 1, len(layout.tensors))
        return Blocker(code="artifact.split_foreign_shard", gate=GATE,
                       why=f"{label} has no split.* keys: it is a whole model, not a shard of this split")
    absent = [key for key in SPLIT_KEYS if key not in metadata]
    if absent:
        return Blocker(code="artifact.split_index_mismatch", gate=GATE, key=absent[0],
                       why=f"{label} has {', '.join(present)} but lacks {', '.join(absent)}")
    count, number, total = metadata[SPLIT_COUNT], metadata[SPLIT_NO], metadata[SPLIT_TENSORS_COUNT]
    for key, value, low, high in ((SPLIT_COUNT, count, 1, MAX_SHARDS),
                                  (SPLIT_TENSORS_COUNT, total, 0, MAX_SPLIT_TENSORS)):
        if not _int_in(value, low, high):
            return Blocker(code="artifact.split_index_mismatch", gate=GATE, key=key,
                           why=f"{label}: {key} = {str(value)[:40]!r} is not an integer in [{low}, {high}]")
    if not _int_in(number, 0, count - 1):
        return Blocker(code="artifact.split_index_mismatch", gate=GATE, key=SPLIT_NO,
                       why=f"{label}: split.no = {str(number)[:40]!r} is not a shard of a {count}-shard split")
    return _Facts(number, count, total)


def _same(a: Any, b: Any) -> bool:
    """Equal as stored: floats and arrays by their bits (NaN equals itself, 0.0 differs from -0.0)."""
    if isinstance(a, GGUFArray) and isinstance(b, GGUFArray):
        if a.element_type is not b.element_type or len(a) != len(b):
            return False
        if isinstance(a.values, np.ndarray) and isinstance(b.values, np.ndarray):
            return a.values.dtype == b.values.dtype and a.values.tobytes() == b.values.tobytes()
        return tuple(a.values) == tuple(b.values)
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


def _summary(value: Any) -> str:
    if isinstance(value, GGUFArray):
        return f"<array of {len(value)} {value.element_type.name}>"
    return repr(value)[:60]


def _foreign(position: int, path: Path, layout: GGUFLayout, seen: dict[str, tuple[int, Any]]) -> Blocker | None:
    """A blocker if a key this shard shares with an earlier member has another value; else record its keys."""
    label = _shard_label(position, path)
    for key, value in layout.metadata.items():
        if key in PER_SHARD_KEYS:
            continue
        earlier = seen.get(key)
        if earlier is not None and not _same(earlier[1], value):
            return Blocker(code="artifact.split_foreign_shard", gate=GATE, key=key,
                           why=f"{label} has {key} = {_summary(value)}, shard {earlier[0] + 1} has "
                               f"{_summary(earlier[1])}: it comes from another split")
    for key, value in layout.metadata.items():
        if key not in PER_SHARD_KEYS:
            seen.setdefault(key, (position, value))
    return None


def _misplaced(position: int, path: Path, facts: _Facts, first_name: ShardName | None) -> Blocker | None:
    """A blocker if split.no, the list position and the file name do not all agree."""
    label = _shard_label(position, path)
    reasons = []
    if facts.number != position:
        reasons.append(f"its split.no is {facts.number}, its position {position}")
    if facts.count > 1:
        name = shard_name(path)
        if name is None:
            reasons.append("its name does not end in -0000k-of-0000n.gguf, so llama.cpp cannot find it")
        else:
            if name.number != position + 1:
                reasons.append(f"its name says shard {name.number}, it is shard {position + 1}")
            if name.count != facts.count:
                reasons.append(f"its name says {name.count} shards, split.count says {facts.count}")
            if first_name is not None and name.prefix != first_name.prefix:
                reasons.append(f"its name's prefix {name.prefix!r} is not the first shard's {first_name.prefix!r}")
    if not reasons:
        return None
    return Blocker(code="artifact.split_index_mismatch", gate=GATE, key=SPLIT_NO,
                   why=f"{label} is out of place: {'; '.join(reasons)}")


@dataclass(slots=True)
class _Reading:
    """What `read_split` has learnt so far; private and mutable, the result is frozen."""

    paths: tuple[Path, ...]
    layouts: list[GGUFLayout | None]
    blockers: list[Blocker]
    members: list[int]  # positions whose shard belongs to the split, in order
    declared: _Facts | None = None  # the first member's split keys: what the split says it is

    @property
    def complete(self) -> bool:
        """Every position holds a readable member shard, and there are as many as `split.count`."""
        return (self.declared is not None and len(self.members) == len(self.paths) == self.declared.count
                and all(layout is not None for layout in self.layouts))


def _sort_members(reading: _Reading) -> None:
    """Decide which readable shards belong to the split and check each one's place in it."""
    seen: dict[str, tuple[int, Any]] = {}
    first_name = shard_name(reading.paths[0])
    for position, (path, layout) in enumerate(zip(reading.paths, reading.layouts, strict=True)):
        if layout is None:
            continue
        facts = _facts(position, path, layout, alone=len(reading.paths) == 1)
        foreign = facts if isinstance(facts, Blocker) and facts.code == "artifact.split_foreign_shard" \
            else _foreign(position, path, layout, seen)
        if foreign is not None:
            reading.blockers.append(foreign)
            continue
        reading.members.append(position)
        if isinstance(facts, Blocker):
            reading.blockers.append(facts)
            continue
        if reading.declared is None:
            reading.declared = facts
        misplaced = _misplaced(position, path, facts, first_name)
        if misplaced is not None:
            reading.blockers.append(misplaced)


def _check_shard_count(reading: _Reading) -> None:
    """As many files as `split.count`: name each missing one, refuse each one too many."""
    declared = reading.declared
    if declared is None:
        return
    given = len(reading.paths)
    first_name = shard_name(reading.paths[0])
    for position in range(given, declared.count):
        expected = first_name.sibling(position + 1) if first_name is not None else f"shard {position + 1}"
        reading.blockers.append(Blocker(
            code="artifact.split_missing_shard", gate=GATE,
            why=f"split.count is {declared.count} but {given} files were given: {expected} is missing"))
    for position in range(declared.count, given):
        if position in reading.members:
            reading.members.remove(position)
            reading.blockers.append(Blocker(
                code="artifact.split_foreign_shard", gate=GATE,
                why=f"{_shard_label(position, reading.paths[position])} is beyond split.count {declared.count}"))


def _union(reading: _Reading) -> dict[str, SplitTensor]:
    """Every member shard's tensors by name; a name already held by an earlier shard is a blocker."""
    union: dict[str, SplitTensor] = {}
    paths = reading.paths
    for position in reading.members:
        layout = reading.layouts[position]
        assert layout is not None
        for info in layout.tensors:
            holder = union.get(info.name)
            if holder is None:
                union[info.name] = SplitTensor(position, info)
                continue
            reading.blockers.append(Blocker(
                code="artifact.split_duplicate_tensor", gate=GATE, tensor=info.name,
                why=f"tensor {info.name!r} is in {_shard_label(holder.shard, paths[holder.shard])} "
                    f"and in {_shard_label(position, paths[position])}"))
    return union


def read_split(paths: Sequence[Path]) -> SplitArtifact:
    """Read the shards at `paths`, in the order given (the order llama.cpp would load them), as one model.

    Blockers, one per defect and shard, in shard order:
    - a shard's own structural defects, with their `gguf.*` codes;
    - `artifact.split_missing_shard`: a file is absent, or there are fewer files than `split.count`;
    - `artifact.split_foreign_shard`: a file is not a shard of this split (see the module docstring),
      or there are more files than `split.count`;
    - `artifact.split_index_mismatch`: split keys absent or out of range, or `split.no`, the position
      and the `-0000k-of-0000n` file name disagree;
    - `artifact.split_duplicate_tensor`: a tensor name in two member shards (llama.cpp refuses it);
    - `artifact.split_tensor_count_mismatch`: the union's distinct names are not `split.tensors.count`.
      Checked only when every shard was read and belongs, since otherwise the union is known to be
      short and the blocker saying why is already there.

    A single path without split keys is a single-file model: no blockers beyond its structure.
    """
    paths = tuple(Path(path) for path in paths)
    if not paths:
        raise UsageError("a split artifact needs at least one shard")
    reading = _Reading(paths, [], [], [])
    for position, path in enumerate(paths):
        opened = _open(position, path)
        reading.layouts.append(None if isinstance(opened, Blocker) else opened)
        if isinstance(opened, Blocker):
            reading.blockers.append(opened)
    _sort_members(reading)
    _check_shard_count(reading)
    union = _union(reading)
    declared = reading.declared
    if reading.complete and declared is not None and len(union) != declared.total:
        reading.blockers.append(Blocker(
            code="artifact.split_tensor_count_mismatch", gate=GATE, key=SPLIT_TENSORS_COUNT,
            why=f"split.tensors.count is {declared.total}, the {len(paths)} shards hold {len(union)} distinct tensors"))
    return SplitArtifact(paths, tuple(reading.layouts), MappingProxyType(union), tuple(reading.blockers))
