"""Gate 1 — storage: is every number in the GGUF the number the source model holds?

Structure first (our bounded parser), then the source (strict safetensors), then inventory,
metadata and per-tensor values, streaming one tensor chunk at a time from memory maps.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from worker.blockers import Blocker
from worker.errors import SourceError
from worker.formats.gguf_structure import GGUFLayout, GGUFStructureError, read_layout
from worker.formats.source import SourceModel, open_source
from worker.gates.architectures import architecture_for, supported
from worker.gates.inventory import take_inventory
from worker.gates.metadata_check import check_metadata
from worker.gates.systematic import reclassify
from worker.gates.value_checks import check_values, pool_size
from worker.policy import Policy
from worker.progress import Progress, no_progress
from worker.quant.imatrix import ImportanceMatrix
from worker.quant.sampling import sampling_details
from worker.report import FileDigest, GateResult, TensorRow
from worker.resources import cpu_budget

UNCHECKED_SHOWN = 40  # tensor names an unsupported-architecture blocker lists; the details hold them all


def _check_kinds(rows: list[TensorRow]) -> dict[str, dict[str, int]]:
    """Per GGUF type, how many tensors were checked which way (for the summary and auditors)."""
    kinds: dict[str, Counter[str]] = {}
    for row in rows:
        kinds.setdefault(row.gguf_type, Counter())[row.check] += 1
    return {gguf_type: dict(counter) for gguf_type, counter in sorted(kinds.items())}


def _failed(started: float, blockers: list[Blocker], **details: object) -> tuple[GateResult, list[Blocker]]:
    result = GateResult(name="storage", status="failed", seconds=time.perf_counter() - started, details=details)
    return result, blockers


def validate_structure(artifact: Path) -> GGUFLayout | Blocker:
    try:
        return read_layout(artifact)
    except GGUFStructureError as exc:
        return Blocker(code=exc.code, gate="storage", why=exc.why, tensor=exc.tensor)


def open_source_or_blocker(source_dir: Path) -> SourceModel | Blocker:
    try:
        return open_source(source_dir)
    except SourceError as exc:
        return Blocker(code=exc.code, gate="input", why=exc.why, tensor=exc.tensor)


def _imatrix_details(imatrix: ImportanceMatrix | None, file: FileDigest | None, weighted: int) -> dict | None:
    """Which importance matrix gate 1 reproduced with, by digest, and how many tensors it weighted."""
    if imatrix is None or file is None:
        return None
    return {"uri": file.uri, "sha256": file.sha256, "size": file.size, "format": imatrix.format,
            "entries": len(imatrix.entries), "datasets": list(imatrix.datasets), "tensors_weighted": weighted}


def _sampling(rows: list[TensorRow], policy: Policy, seed: str | None) -> dict[str, object] | None:
    """The declared sample, when K-quant reproduction was sampled: fraction, seed, detection probability."""
    sampled_rows = [row for row in rows if row.sampled_from is not None]
    if not sampled_rows or seed is None:
        return None
    return sampling_details(policy.reproduce_sample, seed, sum(row.blocks or 0 for row in sampled_rows),
                            sum(row.sampled_from or 0 for row in sampled_rows))


def _unmapped(arch_name: str, layout: GGUFLayout) -> Blocker:
    """An architecture without a map is never GO: the blocker names it and every tensor nobody checked."""
    names = [info.name for info in layout.tensors]
    shown = ", ".join(names[:UNCHECKED_SHOWN]) + (f", ... ({len(names) - UNCHECKED_SHOWN} more)"
                                                  if len(names) > UNCHECKED_SHOWN else "")
    why = (f"architecture {arch_name!r} has no name map (supported: {', '.join(supported())}); "
           f"none of its {len(names)} tensors could be checked: {shown}")
    return Blocker(code="metadata.unsupported_architecture", gate="storage", why=why)


def run_storage_gate(
    artifact: Path, layout: GGUFLayout, source: SourceModel, policy: Policy, progress: Progress = no_progress, *,
    imatrix: ImportanceMatrix | None = None, imatrix_file: FileDigest | None = None, sample_seed: str | None = None,
) -> tuple[GateResult, list[Blocker]]:
    """Inventory, metadata and every tensor's values; structure and source were validated by the caller.
    Quantized tensors are re-quantized with `imatrix`'s weights where it has an entry, as llama-quantize does;
    `sample_seed` (the artifact's sha256) draws the K-quant super-blocks a sampling policy re-quantizes."""
    started = time.perf_counter()
    arch_name = str(layout.metadata.get("general.architecture", ""))
    arch = architecture_for(arch_name, source.config)
    if arch is None:
        return _failed(started, [_unmapped(arch_name, layout)], architecture=arch_name,
                       unchecked_tensors=[info.name for info in layout.tensors])
    try:
        inventory = take_inventory(arch, layout, source)
        metadata = check_metadata(arch, layout, source)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        # The architecture derives names and metadata from config.json fields that may be absent or
        # garbled (types are checked when the source is opened; presence depends on the architecture).
        why = f"config.json cannot give what {arch_name} needs: {type(exc).__name__} {str(exc)[:80]}"
        return _failed(started, [Blocker(code="source.bad_config", gate="input", why=why)])
    processes = pool_size(layout, inventory.pairs, cpu_budget())
    rows, value_blockers, weighted = check_values(artifact, layout, source.root, inventory.pairs, policy, progress,
                                                  imatrix, processes=processes, sample_seed=sample_seed)
    blockers = list(inventory.blockers) + metadata.blockers + value_blockers
    blockers = reclassify(rows, blockers, policy.systematic_fraction, weighted=imatrix is not None)
    details = {
        "structure": "valid",
        "gguf_version": layout.version,
        "architecture": arch_name,
        "tensor_count": len(layout.tensors),
        "check_kinds": _check_kinds(rows),
        "inventory": inventory.classification,
        "metadata": [check.model_dump() for check in metadata.checks],
        "tokenizer_flags": metadata.flags,
        "metadata_not_verified": metadata.not_verified,
        "tensors": [row.model_dump() for row in rows],
        "imatrix": _imatrix_details(imatrix, imatrix_file, weighted),
        "sampling": _sampling(rows, policy, sample_seed),
    }
    status = "failed" if blockers else "passed"
    if not rows:
        why = "no GGUF tensor was compared with a source tensor: nothing was measured"
        blockers.append(Blocker(code="gate.not_run", gate="storage", why=why))
        status, details["why"] = "not_run", why
    return GateResult(name="storage", status=status, seconds=time.perf_counter() - started, details=details), blockers
