"""Gate 2's two references: transformers on the artifact's own weights, and on the source's.

The first answers correctness (llama.cpp's compute path is all that may differ from it); the second
measures what the file costs against its source. Both are built from the source's config and code, so
a GGUF key the runtime reads differently from config.json still shows as a difference.

When gate 1 has just proved every tensor the first reads equal to the source's, bit for bit, the two are
the same model computing the same numbers: one pass serves both questions. Only gate 1's evidence decides
that, never the file's type name, and a converter's value change (Gemma's 1 + w) may not round-trip, so
those are checked value by value here.

One rounding is let through: an F16 of a BF16 source holds every BF16 value of F16's normal range exactly,
but the smaller ones (below 2^-14) fall on F16's subnormal grid, off by at most half its spacing, 2^-25. A
real BF16 checkpoint always has such weights (a normal distribution of std 0.02 puts 0.2% of its values
there), so without this rule its F16 would always run two passes. Gate 1 proves each stored value is the
converter's own rounding of the source's (`mismatched` 0) and no more than 2^-25 away (`max_abs`). Only
weights that small move, each by at most 2^-25: a Linear's output moves by at most 2^-25 times the summed
magnitude of the inputs those few weights meet. For a row of 4,096 weights of std 0.02, with ~8 of them
below 2^-14, that is ~10^-7 of one input's magnitude, thousands of times less than the float16 rounding
(2^-11 relative) llama.cpp applies to the same output. So the quality figures of one pass differ from a
second pass's by far less than either side's own noise, and the report says the rounding was let through
and in how many tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import numpy as np

from engine.errors import CodedError
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import SourceModel
from engine.gates.architectures import architecture_for
from engine.gates.architectures.derived import DerivedTensor
from engine.gates.computed_tensors import ComputedTensor
from engine.gates.inventory import Pairing, take_inventory
from engine.report import TensorRow
from engine.runtime.artifact_weights import ArtifactCheckpoint
from engine.runtime.checkpoints import source_checkpoint
from engine.runtime.hf_reference import HFModel

VALUE_CHECKED_ELEMENTS = 1 << 22  # a value-changed tensor larger than this is not compared here (two passes)


@dataclass(frozen=True)
class References:
    """What gate 2 compares llama.cpp with: `source` is `correct` itself when one pass serves both."""

    correct: HFModel
    source: HFModel
    notes: list[str]
    one_pass_why: str  # why one pass serves both, or why it cannot

    @property
    def passes(self) -> int:
        return 1 if self.source is self.correct else 2


F16_SUBNORMAL_ROUNDING = 2.0 ** -25  # half the spacing of F16's values below its normal range (module docstring)


def _exact(row: TensorRow | None) -> bool:
    """Gate 1 found this tensor's stored values equal to the source's as float32, bit for bit."""
    return _as_converted(row) and row.max_abs == 0.0


def _rounded_below_normal(row: TensorRow | None) -> bool:
    """Gate 1 found this F16 tensor to be the converter's rounding of a BF16 source, off by at most 2^-25."""
    return _as_converted(row) and row.gguf_type == "F16" and row.source_dtype == "BF16" and \
        0.0 < row.max_abs <= F16_SUBNORMAL_ROUNDING


def _as_converted(row: TensorRow | None) -> TypeGuard[TensorRow]:
    """Every stored value is the converter's own rounding of the source's value: nothing else changed."""
    return row is not None and row.result == "ok" and row.check == "bit-exact" and row.mismatched == 0 and \
        row.not_finite == 0 and row.signed_zero_flips == 0


def _value_change_undone(checkpoint: ArtifactCheckpoint, derived: DerivedTensor) -> bool:
    """A converter's value change, undone, gives back the source's values bit for bit (small tensors only)."""
    if int(np.prod(derived.shape)) > VALUE_CHECKED_ELEMENTS:
        return False
    names = [part.name for part in derived.parts]
    artifact, source = checkpoint.read(names), checkpoint.source.read(names)
    return all(np.array_equal(artifact[name].numpy().view(np.uint32), source[name].numpy().view(np.uint32))
               for name in names)


def _one_pass_refusal(checkpoint: ArtifactCheckpoint, pairs: tuple[Pairing, ...], has_blockers: bool,
                      rows: Mapping[str, TensorRow] | None) -> tuple[str | None, int]:
    """Why the artifact's weights are not proved equal to the source's (None when they are), and how many
    tensors were let through with float16's rounding below its normal range."""
    if rows is None:
        return "gate 1 did not check every tensor in this process", 0
    if has_blockers:
        return "gate 1's inventory found tensors it could not pair", 0
    rounded = 0
    for pair in pairs:
        if isinstance(pair.source, ComputedTensor):  # the reference computes it from the config, as transformers does
            continue
        row = rows.get(pair.gguf_name)
        if _rounded_below_normal(row) and not isinstance(pair.source, DerivedTensor):
            rounded += 1
            continue
        if not _exact(row):
            return f"gate 1 did not find {pair.gguf_name} bit-exact to the source", rounded
        if isinstance(pair.source, DerivedTensor) and pair.source.values is not None and \
                not _value_change_undone(checkpoint, pair.source):
            return f"{pair.gguf_name}'s value change does not give back the source's values bit for bit", rounded
    return None, rounded


def references(artifact: Path, layout: GGUFLayout, source: SourceModel, kind: str,
               storage_rows: Mapping[str, TensorRow] | None = None) -> References:
    """transformers on the artifact's weights (correctness) and on the source's (quality), one model when
    `storage_rows` (gate 1's per-tensor rows, every tensor's) prove the weights equal."""
    causal, classifier = kind == "causal-lm", kind == "reranker"
    notes: list[str] = []
    arch = architecture_for(str(layout.metadata.get("general.architecture", "")), source.config)
    plain = source_checkpoint(source.root)
    if arch is None or plain is None:
        raise CodedError("runtime.no_artifact_reference", "gate 2 cannot rebuild the model from the artifact's "
                         "weights: " + ("no tensor map for its architecture" if arch is None else
                                        "the source has no safetensors"))
    inventory = take_inventory(arch, layout, source)
    if inventory.blockers:
        notes.append("gate 2's artifact-weights reference took the source's values for tensors the artifact "
                     "does not hold as the source names them (see gate 1's inventory)")
    checkpoint = ArtifactCheckpoint(artifact, layout, inventory.pairs, plain)
    correct = HFModel(source.root, checkpoint=checkpoint, causal=causal, classifier=classifier)
    refusal, rounded = _one_pass_refusal(checkpoint, inventory.pairs, bool(inventory.blockers), storage_rows)
    if refusal is None:
        aside = (f" (float16's rounding of values below its normal range aside, at most 2^-25 per weight, in "
                 f"{rounded} tensors)") if rounded else ""
        return References(correct, correct, notes, f"gate 1 proved every tensor the reference reads bit-exact to the "
                                                   f"source{aside}: one pass answers correctness and quality")
    return References(correct, HFModel(source.root, causal=causal, classifier=classifier), notes,
                      f"two passes: {refusal}")
