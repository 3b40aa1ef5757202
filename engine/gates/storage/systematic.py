"""Tell a quantizer that is not ours from a defect, by the shape of the reproduction differences.

Another quantizer (an older or newer llama.cpp, a publisher's own code, or ours given no importance
matrix) differs *systematically*: most blocks of every tensor of a type. A defect is *isolated*: a
few blocks of a tensor, or one tensor in a file whose other tensors of that type reproduce, and it
stays `tensor.reproduction_mismatch` even when it is within the bound. Only tensors an imatrix made
with llama-imatrix's defaults never weighs (`UNWEIGHTED_TENSORS`) may reproduce among systematically
differing ones: they are quantized without weights even in an imatrix file.

Systematic tensors of a type become one non-defect blocker naming the build we carry and what
differed; whether that may be GO is decided in `engine.acceptance`, never here.
"""

from __future__ import annotations

import ctypes
from collections import defaultdict

from engine.blockers import Blocker
from engine.errors import ReferenceMissingError
from engine.quant import libggml, reference
from engine.report import TensorRow
from engine.versions import package_version

# Tensors an imatrix file made by llama-imatrix's defaults holds no weights for, so they are quantized
# without any and reproduce even in an imatrix file: the token embedding (read with get_rows, never
# multiplied) and the output head (collected only with `--process-output`).
UNWEIGHTED_TENSORS = ("token_embd.weight", "output.weight")
LISTED_TENSORS = 6


def quantizer_build() -> str:
    """The quantizer we carry: llama-cpp-python's version and its ggml version and commit."""
    package = f"llama-cpp-python {package_version('llama-cpp-python') or '(not installed)'}"
    try:
        lib = libggml._lib()
        lib.ggml_version.restype = lib.ggml_commit.restype = ctypes.c_char_p
        return f"{package}, ggml {lib.ggml_version().decode()} ({lib.ggml_commit().decode()})"
    except (AttributeError, OSError, ReferenceMissingError):
        return package


def _systematic_types(rows: list[TensorRow], fraction: float) -> dict[str, list[TensorRow]]:
    """Types whose differing tensors all differ in >= `fraction` of blocks, at least two of them, and
    whose other tensors (those that reproduce) are only ones an imatrix never weighs."""
    by_type: dict[str, list[TensorRow]] = defaultdict(list)
    for row in rows:
        if row.check == "reproduced" and row.blocks:
            by_type[row.gguf_type].append(row)
    found: dict[str, list[TensorRow]] = {}
    for type_name, typed in by_type.items():
        differing = [row for row in typed if row.mismatched]
        wholly = [row for row in differing if row.blocks and row.mismatched >= fraction * row.blocks]
        reproducing = [row.gguf_name for row in typed if not row.mismatched]
        if len(wholly) >= 2 and len(wholly) == len(differing) and set(reproducing) <= set(UNWEIGHTED_TENSORS):
            found[type_name] = wholly
    return found


def _why(type_name: str, rows: list[TensorRow], weighted: bool, build: str) -> tuple[str, str]:
    blocks = sum(row.blocks or 0 for row in rows)
    differing = sum(row.mismatched for row in rows)
    names = ", ".join(row.gguf_name for row in rows[:LISTED_TENSORS])
    more = f" and {len(rows) - LISTED_TENSORS} more" if len(rows) > LISTED_TENSORS else ""
    what = (f"{len(rows)} {type_name} tensors ({names}{more}) differ systematically from {build}: "
            f"{differing} of {blocks} blocks")
    if not weighted and type_name not in reference.WEIGHT_BLIND:
        return "tensor.not_reproduced", (f"{what}; no importance matrix was given, so they were likely quantized "
                                         "with one (or by another quantizer): supply the imatrix to reproduce them")
    if weighted and type_name not in reference.WEIGHT_BLIND:
        return "tensor.other_quantizer", (f"{what} with the importance matrix given; not reproducible with the "
                                          "quantizer we carry, or the file was quantized with another imatrix")
    return "tensor.other_quantizer", f"{what}; not reproducible with the quantizer we carry"


def reclassify(rows: list[TensorRow], blockers: list[Blocker], fraction: float,
               weighted: bool = False) -> list[Blocker]:
    """`blockers` with the reproduction mismatches of systematically differing types replaced by one
    non-defect blocker per type; isolated differences stay defects. `weighted`: an imatrix was given."""
    systematic = _systematic_types(rows, fraction)
    if not systematic:
        return blockers
    names = {row.gguf_name for typed in systematic.values() for row in typed}
    kept = [b for b in blockers if not (b.code == "tensor.reproduction_mismatch" and b.tensor in names)]
    build = quantizer_build()
    for type_name, typed in sorted(systematic.items()):
        code, why = _why(type_name, typed, weighted, build)
        kept.append(Blocker(code=code, gate="storage", why=why))
    return kept
