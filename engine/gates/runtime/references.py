"""Gate 2's two references: transformers on the artifact's own weights, and on the source's.

The first answers correctness (llama.cpp's compute path is all that may differ from it); the second
measures what the file costs against its source. Both are built from the source's config and code, so
a GGUF key the runtime reads differently from config.json still shows as a difference.

When gate 1 has just proved every tensor the first reads equal to the source's, bit for bit, the two are
the same model computing the same numbers: one pass serves both questions. Only gate 1's evidence decides
that, never the file's type name: an F16 of a BF16 source is exact only while no value underflows F16's
range, and a converter's value change (Gemma's 1 + w) may not round-trip, so those are checked value by
value here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

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


def _exact(row: TensorRow | None) -> bool:
    """Gate 1 found this tensor's stored values equal to the source's as float32, bit for bit."""
    return row is not None and row.result == "ok" and row.check == "bit-exact" and row.mismatched == 0 and \
        row.max_abs == 0.0 and row.not_finite == 0 and row.signed_zero_flips == 0


def _value_change_undone(checkpoint: ArtifactCheckpoint, derived: DerivedTensor) -> bool:
    """A converter's value change, undone, gives back the source's values bit for bit (small tensors only)."""
    if int(np.prod(derived.shape)) > VALUE_CHECKED_ELEMENTS:
        return False
    names = [part.name for part in derived.parts]
    artifact, source = checkpoint.read(names), checkpoint.source.read(names)
    return all(np.array_equal(artifact[name].numpy().view(np.uint32), source[name].numpy().view(np.uint32))
               for name in names)


def _one_pass_refusal(checkpoint: ArtifactCheckpoint, pairs: tuple[Pairing, ...], has_blockers: bool,
                      rows: Mapping[str, TensorRow] | None) -> str | None:
    """Why the artifact's weights are not proved equal to the source's, or None when they are."""
    if rows is None:
        return "gate 1 did not check every tensor in this process"
    if has_blockers:
        return "gate 1's inventory found tensors it could not pair"
    for pair in pairs:
        if isinstance(pair.source, ComputedTensor):  # the reference computes it from the config, as transformers does
            continue
        if not _exact(rows.get(pair.gguf_name)):
            return f"gate 1 did not find {pair.gguf_name} bit-exact to the source"
        if isinstance(pair.source, DerivedTensor) and pair.source.values is not None and \
                not _value_change_undone(checkpoint, pair.source):
            return f"{pair.gguf_name}'s value change does not give back the source's values bit for bit"
    return None


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
    refusal = _one_pass_refusal(checkpoint, inventory.pairs, bool(inventory.blockers), storage_rows)
    if refusal is None:
        return References(correct, correct, notes, "gate 1 proved every tensor the reference reads bit-exact to the "
                                                   "source: one pass answers correctness and quality")
    return References(correct, HFModel(source.root, causal=causal, classifier=classifier), notes,
                      f"two passes: {refusal}")
