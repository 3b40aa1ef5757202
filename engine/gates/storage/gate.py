"""Gate 1 — storage: is every number in the GGUF the number the source model holds?

Structure first (our bounded parser), then the source (strict safetensors), then inventory,
metadata and per-tensor values, streaming one tensor chunk at a time from memory maps.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from engine.blockers import Blocker
from engine.errors import SourceError
from engine.evidence import Sampling, storage_details
from engine.formats.artifact_files import read_artifact
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import SourceModel, open_source
from engine.gates.architectures import architecture_for, supported
from engine.gates.contract import ControlInputs, GateContext, GateName, GateOutcome, Plant
from engine.gates.inventory import Inventory, take_inventory
from engine.gates.storage.controls import storage_controls
from engine.gates.storage.metadata_check import MetadataOutcome, check_metadata
from engine.gates.storage.parts import StoragePart, assign, merge_parts
from engine.gates.storage.value_checks import check_values, pool_size
from engine.policy import Policy
from engine.progress import Progress, no_progress
from engine.quant.imatrix import ImportanceMatrix
from engine.report import FileDigest, GateResult
from engine.resources import cpu_budget

UNCHECKED_SHOWN = 40  # tensor names an unsupported-architecture blocker lists; the details hold them all


def _failed(started: float, blockers: list[Blocker], **details: object) -> tuple[GateResult, list[Blocker]]:
    result = GateResult(name="storage", status="failed", seconds=time.perf_counter() - started, details=details)
    return result, blockers


def validate_structure(artifact: Path) -> GGUFLayout | tuple[Blocker, ...]:
    """The artifact (one file, or every shard of a split named by its first) as one layout, or each of its
    structural defects: a split can have several, one per shard."""
    return read_artifact(artifact)


def open_source_or_blocker(source_dir: Path) -> SourceModel | Blocker:
    try:
        return open_source(source_dir)
    except SourceError as exc:
        return Blocker(code=exc.code, gate="input", why=exc.why, tensor=exc.tensor)


def _imatrix_details(imatrix: ImportanceMatrix | None, file: FileDigest | None) -> dict | None:
    """Which importance matrix gate 1 reproduced with, by digest (the merge adds how many tensors it weighed)."""
    if imatrix is None or file is None:
        return None
    return {"uri": file.uri, "sha256": file.sha256, "size": file.size, "format": imatrix.format,
            "entries": len(imatrix.entries), "datasets": list(imatrix.datasets)}


def _unmapped(arch_name: str, layout: GGUFLayout) -> Blocker:
    """An architecture without a map is never GO: the blocker names it and every tensor nobody checked."""
    names = [info.name for info in layout.tensors]
    shown = ", ".join(names[:UNCHECKED_SHOWN]) + (f", ... ({len(names) - UNCHECKED_SHOWN} more)"
                                                  if len(names) > UNCHECKED_SHOWN else "")
    why = (f"architecture {arch_name!r} has no name map (supported: {', '.join(supported())}); "
           f"none of its {len(names)} tensors could be checked: {shown}")
    return Blocker(code="metadata.unsupported_architecture", gate="storage", why=why)


def _prepared(arch_name: str, layout: GGUFLayout, source: SourceModel,
              started: float) -> tuple[Inventory, MetadataOutcome] | tuple[GateResult, list[Blocker]]:
    """The inventory and metadata checks, or the failed gate when the architecture cannot be mapped."""
    arch = architecture_for(arch_name, source.config)
    if arch is None:
        return _failed(started, [_unmapped(arch_name, layout)], architecture=arch_name,
                       unchecked_tensors=[info.name for info in layout.tensors])
    try:
        return take_inventory(arch, layout, source), check_metadata(arch, layout, source)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        # The architecture derives names and metadata from config.json fields that may be absent or
        # garbled (types are checked when the source is opened; presence depends on the architecture).
        why = f"config.json cannot give what {arch_name} needs: {type(exc).__name__} {str(exc)[:80]}"
        return _failed(started, [Blocker(code="source.bad_config", gate="input", why=why)])


def run_storage_part(
    artifact: Path, layout: GGUFLayout, source: SourceModel, policy: Policy, progress: Progress = no_progress, *,
    imatrix: ImportanceMatrix | None = None, imatrix_file: FileDigest | None = None, sample_seed: str | None = None,
    shard: int = 0, shards: int = 1,
) -> StoragePart | tuple[GateResult, list[Blocker]]:
    """Inventory, metadata and the values of this shard's share of the tensors (`assign`), or the failed
    gate when nothing can be paired (the same for every shard)."""
    started = time.perf_counter()
    arch_name = str(layout.metadata.get("general.architecture", ""))
    prepared = _prepared(arch_name, layout, source, started)
    if isinstance(prepared[0], GateResult):
        return prepared
    inventory, metadata = prepared
    pairs = inventory.pairs
    owners = assign([math.prod(layout.tensor(pair.gguf_name).shape) for pair in pairs], shards)
    mine = [index for index, owner in enumerate(owners) if owner == shard]
    processes = pool_size(layout, tuple(pairs[index] for index in mine), cpu_budget())
    outcomes = check_values(artifact, layout, source.root, pairs, policy, progress, imatrix, processes=processes,
                            sample_seed=sample_seed, only=mine)
    head = {"structure": "valid", "gguf_version": layout.version, "architecture": arch_name,
            "tensor_count": len(layout.tensors), "inventory": inventory.classification,
            "metadata": [check.model_dump() for check in metadata.checks], "tokenizer_flags": metadata.flags,
            "metadata_not_verified": metadata.not_verified}
    return StoragePart(
        shard=shard, shards=shards, artifact_sha256=sample_seed, pair_names=[pair.gguf_name for pair in pairs],
        checked=outcomes,
        head_blockers=list(inventory.blockers) + metadata.blockers, head=head,
        imatrix=_imatrix_details(imatrix, imatrix_file), seconds=time.perf_counter() - started,
    )


def run_storage_gate(
    artifact: Path, layout: GGUFLayout, source: SourceModel, policy: Policy, progress: Progress = no_progress, *,
    imatrix: ImportanceMatrix | None = None, imatrix_file: FileDigest | None = None, sample_seed: str | None = None,
) -> tuple[GateResult, list[Blocker]]:
    """Inventory, metadata and every tensor's values; structure and source were validated by the caller.
    Quantized tensors are re-quantized with `imatrix`'s weights where it has an entry, as llama-quantize does;
    `sample_seed` (the artifact's sha256) draws the K-quant super-blocks a sampling policy re-quantizes.
    One part holding every tensor, merged alone: the same path a sharded run's parts take."""
    part = run_storage_part(artifact, layout, source, policy, progress, imatrix=imatrix, imatrix_file=imatrix_file,
                            sample_seed=sample_seed)
    return merge_parts([part], policy) if isinstance(part, StoragePart) else part


def sampled_note(sample: Sampling) -> str:
    """The not-verified line of a sampled gate 1: what was skipped and what the sample can promise."""
    one = sample.detection_probability["1"]
    ten = sample.detection_probability["10"]
    return (f"K-quant super-blocks re-quantized on a sample: {sample.super_blocks_reproduced} of "
            f"{sample.super_blocks_total} (fraction {sample.fraction}, seed sha256 {sample.seed[:16]}...); "
            f"a single corrupted super-block is caught with probability {one:.3g}, ten with {ten:.3g}")


def storage_notes(storage: GateResult) -> list[str]:
    """What gate 1 declares not verified: a sampled reproduction, and the GGUF keys it does not compare."""
    figures = storage_details(storage.details)
    return ([sampled_note(figures.sampling)] if figures.sampling else []) + figures.metadata_not_verified


class StorageGate:
    """Gate 1. It runs in every pod of a split verification, each checking its share of the tensors; its
    parts are merged (with the notes above) once all have reported, so its outcome here is usually a part."""

    number = 1
    name: GateName = "storage"
    every_shard = True
    libraries: tuple[str, ...] = ()

    def run(self, context: GateContext) -> GateOutcome:
        found = run_storage_part(context.artifact, context.layout, context.source, context.policy, context.progress,
                                 imatrix=context.imatrix, imatrix_file=context.imatrix_file,
                                 sample_seed=context.artifact_sha256, shard=context.shard, shards=context.shards)
        if isinstance(found, StoragePart):
            context.part = found
            return GateOutcome()
        result, blockers = found  # the architecture cannot be paired: the same failed gate in every shard
        return GateOutcome(result=result, blockers=blockers)

    def plants(self, inputs: ControlInputs) -> list[Plant]:
        return [lambda: storage_controls(inputs.artifact, inputs.layout, inputs.source, inputs.policy, inputs.imatrix,
                                         inputs.artifact_sha256)]


STORAGE = StorageGate()
