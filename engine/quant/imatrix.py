"""llama.cpp's importance matrix (imatrix), read into the weights llama-quantize hands to libggml.

Two file forms exist (llama.cpp tools/imatrix, common/imatrix-loader.cpp):
- GGUF: per tensor `<name>.in_sum2` (F32, ne = [ne0, n_mat]: summed squared activations per column)
  and `<name>.counts` (F32, ne = [1, n_mat]: tokens seen per matrix), plus the `imatrix.datasets`,
  `imatrix.chunk_count` and `imatrix.chunk_size` keys, without which llama-quantize refuses the file;
- legacy `.dat`: i32 entry count, then per entry i32 name length, name, i32 ncall, i32 nval and nval
  f32 holding `(sum / count) * ncall`; optionally i32 chunk count, i32 length and the dataset name.

llama-quantize (tools/quantize/quantize.cpp `load_imatrix`) turns them into one float32 vector per
tensor: GGUF `sum / (float)lround(count)` per matrix (1 where the count is 0), legacy `value / ncall`
(the value itself when ncall <= 0), both float32 divisions, reproduced here bit for bit. llama-quant.cpp
then passes, per expert e of a tensor [ne0, ne1, ne2], the slice [e*ne0, (e+1)*ne0) to
`ggml_quantize_chunk`; a tensor without an entry is quantized without weights; an entry whose length is
not ne0*ne2 aborts the quantization, except for the token embedding, where it is ignored.

Every count is checked against the bytes left before anything is allocated; the GGUF form goes
through our bounded GGUF parser first. Any defect is `ImatrixError` with an `imatrix.*` code.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from engine.errors import CodedError
from engine.formats.gguf_structure import GGUF_MAGIC, GGUFArray, GGUFLayout, GGUFStructureError, parse_buffer

SUMS_SUFFIX, COUNTS_SUFFIX = ".in_sum2", ".counts"
REQUIRED_KEYS = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")
TOKEN_EMBEDDINGS = ("token_embd.weight", "per_layer_token_embd.weight")  # llama-quant.cpp's exemption
MAX_NAME_BYTES = 1024
MIN_DAT_ENTRY_BYTES = 4 + 1 + 4 + 4 + 4  # name length, a 1-byte name, ncall, nval, one value


class ImatrixError(CodedError):
    """The importance matrix cannot be used: `imatrix.malformed` or, per tensor, `imatrix.entry_mismatch`."""


def _malformed(why: str) -> ImatrixError:
    return ImatrixError("imatrix.malformed", why)


@dataclass(frozen=True, slots=True)
class ImportanceMatrix:
    """Tensor name -> the float32 weights llama-quantize derives (n_mat * ne0 values, matrix-major)."""

    format: str  # "gguf" or "dat"
    entries: Mapping[str, np.ndarray]
    datasets: tuple[str, ...]
    chunk_count: int
    chunk_size: int  # 0 for the legacy form, which does not record it

    def weights_for(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """The `quant_weights` llama-quantize passes for tensor `name` of ggml shape `shape` (ne0 first):
        None without an entry; (ne0,) for a matrix; (ne2, ne0), one row per expert, for a stack."""
        weights = self.entries.get(name)
        if weights is None:
            return None
        ne0, n_mat = shape[0], shape[2] if len(shape) > 2 else 1
        if weights.size != ne0 * n_mat:
            if name in TOKEN_EMBEDDINGS:
                return None
            raise ImatrixError("imatrix.entry_mismatch", f"the imatrix entry for {name} holds {weights.size} "
                               f"weights, the tensor needs {ne0}x{n_mat} ({ne0 * n_mat}); llama-quantize refuses "
                               "such a matrix, so no file was quantized with it", name)
        return weights if len(shape) <= 2 else weights.reshape(n_mat, ne0)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Gate 1's spawned pool pickles the matrix with its job: the read-only view cannot be pickled, so
        it travels as a plain dict and is wrapped again on arrival."""
        return _rebuilt, (self.format, dict(self.entries), self.datasets, self.chunk_count, self.chunk_size)


def _rebuilt(form: str, entries: dict[str, np.ndarray], datasets: tuple[str, ...], chunk_count: int,
             chunk_size: int) -> ImportanceMatrix:
    return ImportanceMatrix(form, MappingProxyType(entries), datasets, chunk_count, chunk_size)


def _finite(name: str, values: np.ndarray, what: str) -> np.ndarray:
    if not np.isfinite(values).all():
        raise _malformed(f"the {what} of {name!r} are not all finite (llama-quantize refuses non-finite weights)")
    return values


def _f32_tensor(layout: GGUFLayout, buffer: bytes | mmap.mmap, name: str) -> np.ndarray:
    info = layout.tensor(name)
    if info.ggml_type.name != "F32":
        raise _malformed(f"{name} is {info.ggml_type.name}; llama.cpp reads only F32 sums and counts")
    return np.frombuffer(buffer, dtype="<f4", count=info.n_elements, offset=info.offset).astype(np.float32)


def _gguf_weights(name: str, sums: np.ndarray, raw_counts: np.ndarray) -> np.ndarray:
    if raw_counts.size == 0 or sums.size % raw_counts.size:
        raise _malformed(f"{name}: {raw_counts.size} counts do not divide {sums.size} sums into matrices")
    # quantize.cpp: (float)lround(count). lround rounds halves away from zero (numpy's round goes to even);
    # floor(x + 0.5) in float64 is that for x >= 0, and any x < 0 stays <= 0, which weighs 1 either way.
    counts = np.floor(_finite(name, raw_counts, "counts").astype(np.float64) + 0.5).astype(np.float32)
    per_matrix = _finite(name, sums, "sums").reshape(raw_counts.size, -1)
    weights = np.ones_like(per_matrix)
    used = counts > 0
    weights[used] = per_matrix[used] / counts[used, None]  # finite: finite sums over counts >= 1
    return weights.reshape(-1)


def _metadata(layout: GGUFLayout) -> tuple[tuple[str, ...], int, int]:
    missing = [key for key in REQUIRED_KEYS if key not in layout.metadata]
    if missing:
        raise _malformed(f"no {', '.join(missing)}: llama-quantize refuses a GGUF imatrix without its metadata")
    datasets = layout.metadata["imatrix.datasets"]
    names = tuple(str(v) for v in datasets.values) if isinstance(datasets, GGUFArray) else ()
    counts = [layout.metadata[key] for key in REQUIRED_KEYS[1:]]
    if not all(type(value) is int and 0 <= value < 1 << 32 for value in counts):
        raise _malformed("imatrix.chunk_count and imatrix.chunk_size must be u32 values")
    return names, counts[0], counts[1]


def _parse_gguf(buffer: bytes | mmap.mmap, path: Path) -> ImportanceMatrix:
    try:
        layout = parse_buffer(buffer, path)
    except GGUFStructureError as exc:
        raise _malformed(f"not a well-formed GGUF ({exc.code}): {exc.why}") from exc
    datasets, chunk_count, chunk_size = _metadata(layout)
    names = {info.name for info in layout.tensors}
    bases = {n.removesuffix(s) for n in names for s in (SUMS_SUFFIX, COUNTS_SUFFIX) if n.endswith(s) and n != s}
    entries: dict[str, np.ndarray] = {}
    for base in sorted(bases):
        if base + SUMS_SUFFIX not in names or base + COUNTS_SUFFIX not in names:
            raise _malformed(f"{base} has sums without counts or counts without sums")
        sums = _f32_tensor(layout, buffer, base + SUMS_SUFFIX)
        entries[base] = _gguf_weights(base, sums, _f32_tensor(layout, buffer, base + COUNTS_SUFFIX))
    return _matrix("gguf", entries, datasets, chunk_count, chunk_size)


class _Reader:
    """Little-endian reads from the legacy form that never pass the end of the file."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        self.data, self.pos = data, 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise _malformed(f"the file ends inside {what} (truncated)")
        chunk = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return chunk

    def i32(self, what: str) -> int:
        value: int = struct.unpack("<i", self.take(4, what))[0]
        return value


def _dat_name(reader: _Reader, index: int) -> str:
    length = reader.i32(f"the name length of entry {index}")
    if not 0 < length <= min(MAX_NAME_BYTES, reader.left):
        raise _malformed(f"entry {index} declares a name of {length} bytes (1..{MAX_NAME_BYTES}, within the file)")
    raw = reader.take(length, f"the name of entry {index}")
    if b"\0" in raw:
        raise _malformed(f"the name of entry {index} holds a NUL byte")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _malformed(f"the name of entry {index} is not valid UTF-8") from exc


def _dat_entry(reader: _Reader, index: int) -> tuple[str, np.ndarray]:
    name = _dat_name(reader, index)
    ncall = reader.i32(f"the call count of {name!r}")
    nval = reader.i32(f"the value count of {name!r}")
    if not 0 < nval <= reader.left // 4:
        raise _malformed(f"{name!r} declares {nval} values; the file holds at most {reader.left // 4} more")
    stored = _finite(name, np.frombuffer(reader.take(4 * nval, f"the values of {name!r}"), dtype="<f4"), "values")
    weights = stored / np.float32(ncall) if ncall > 0 else stored.copy()  # int -> float division, as quantize.cpp
    return name, weights.astype(np.float32)  # finite: finite values over ncall >= 1


def _parse_dat(data: bytes | mmap.mmap) -> ImportanceMatrix:
    reader = _Reader(data)
    n_entries = reader.i32("the entry count")
    if not 0 < n_entries <= reader.left // MIN_DAT_ENTRY_BYTES:
        raise _malformed(f"the legacy imatrix declares {n_entries} entries; the file could hold at most "
                         f"{reader.left // MIN_DAT_ENTRY_BYTES}")
    entries: dict[str, np.ndarray] = {}
    for index in range(n_entries):
        name, weights = _dat_entry(reader, index)
        if name in entries:
            raise _malformed(f"entry {name!r} appears twice (llama-quantize would keep only the last)")
        entries[name] = weights
    chunk_count = 0
    datasets_named: tuple[str, ...] = ()
    if reader.left:  # the trailer: chunk count, then the dataset name
        chunk_count = reader.i32("the trailing chunk count")
        length = reader.i32("the dataset name length")
        if not 0 <= length <= reader.left:
            raise _malformed(f"the dataset name declares {length} bytes; {reader.left} are left")
        named = reader.take(length, "the dataset name").decode("utf-8", errors="backslashreplace")
        datasets_named = (named,) if named else ()  # llama.cpp keeps a dataset name only if it is not empty
    if reader.left:
        raise _malformed(f"{reader.left} bytes after the end of the legacy imatrix")
    return _matrix("dat", entries, datasets_named, chunk_count, 0)


def _matrix(form: str, entries: dict[str, np.ndarray], datasets: tuple[str, ...], chunk_count: int,
            chunk_size: int) -> ImportanceMatrix:
    if not entries:
        raise _malformed("the file holds no importance matrix entries")
    for weights in entries.values():
        weights.flags.writeable = False
    return ImportanceMatrix(form, MappingProxyType(entries), datasets, chunk_count, chunk_size)


def parse_imatrix(data: bytes | mmap.mmap, path: Path) -> ImportanceMatrix:
    """Either form, told apart by the GGUF magic (llama.cpp tries GGUF first, then the legacy form)."""
    if len(data) == 0:
        raise _malformed("the importance matrix file is empty")
    if bytes(data[:4]) == GGUF_MAGIC:
        return _parse_gguf(data, path)
    return _parse_dat(data)


def read_imatrix(path: Path) -> ImportanceMatrix:
    """Read `path` (memory-mapped, read-only) into the weights llama-quantize would use."""
    try:
        with path.open("rb") as handle:
            if path.stat().st_size == 0:
                return parse_imatrix(b"", path)
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                return parse_imatrix(buffer, path)
    except OSError as exc:
        raise _malformed(f"cannot read {path.name}: {exc.strerror or exc}") from exc


__all__ = ["ImatrixError", "ImportanceMatrix", "parse_imatrix", "read_imatrix"]
