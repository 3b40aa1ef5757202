"""Gate 2's two references: transformers on the artifact's own weights, and on the source's.

The first answers correctness (llama.cpp's compute path is all that may differ from it); the second
measures what the file costs against its source. Both are built from the source's config and code, so
a GGUF key the runtime reads differently from config.json still shows as a difference.
"""

from __future__ import annotations

from pathlib import Path

from worker.errors import CodedError
from worker.formats.gguf_structure import GGUFLayout
from worker.formats.source import SourceModel
from worker.gates.architectures import architecture_for
from worker.gates.inventory import take_inventory
from worker.runtime.artifact_weights import ArtifactCheckpoint
from worker.runtime.checkpoints import source_checkpoint
from worker.runtime.hf_reference import HFModel


def references(artifact: Path, layout: GGUFLayout, source: SourceModel,
               kind: str) -> tuple[HFModel, HFModel, list[str]]:
    """transformers on the artifact's weights (correctness) and on the source's (quality), and what the
    first could not take from the artifact."""
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
    return (HFModel(source.root, checkpoint=checkpoint, causal=causal, classifier=classifier),
            HFModel(source.root, causal=causal, classifier=classifier), notes)
