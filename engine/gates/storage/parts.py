"""Gate 1 in parts: a share of the tensors checked by one worker, and the merge of every part into
the gate's one result.

Even an unsharded run is one part merged alone, so a verification split over N pods (a Kubernetes
Indexed Job, one completion index per part) and one run on a single pod produce the same report by
construction. A part is plain JSON (it travels through the database from each pod to the single
writer that merges them); every part carries the whole inventory's names, so parts made from
different files or sources refuse to merge.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine.blockers import Blocker
from engine.errors import ConvgateError
from engine.gates.storage.systematic import reclassify
from engine.gates.storage.value_checks import CheckedPair
from engine.policy import Policy
from engine.quant.sampling import sampling_details
from engine.report import GateResult, TensorRow


class MergeError(ConvgateError, ValueError):
    """The parts do not make one gate-1 result (missing, duplicated or from different inputs)."""

    code = "storage.parts_do_not_merge"


class StoragePart(BaseModel):
    """What one worker found for its share of gate 1, and (identically in every part) the inventory
    and metadata findings, which are cheap and computed by each."""

    model_config = ConfigDict(extra="forbid")

    shard: int
    shards: int
    artifact_sha256: str | None
    pair_names: list[str]
    checked: list[CheckedPair]
    head_blockers: list[Blocker]  # inventory and metadata: counted once, from part 0
    head: dict[str, Any]  # details that do not depend on the tensors checked
    imatrix: dict[str, Any] | None  # the matrix's digest and form, without the count of tensors it weighed
    seconds: float


def assign(weights: list[int], shards: int) -> list[int]:
    """The shard of each pair: largest first to the least loaded shard (ties to the lowest), so shares
    are balanced and the same for everyone who computes them."""
    owner = [0] * len(weights)
    loads = [(0, shard) for shard in range(shards)]
    for index in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, shard = heapq.heappop(loads)
        owner[index] = shard
        heapq.heappush(loads, (load + weights[index], shard))
    return owner


def _check_kinds(rows: list[TensorRow]) -> dict[str, dict[str, int]]:
    """Per GGUF type, how many tensors were checked which way (for the summary and auditors)."""
    kinds: dict[str, Counter[str]] = {}
    for row in rows:
        kinds.setdefault(row.gguf_type, Counter())[row.check] += 1
    return {gguf_type: dict(counter) for gguf_type, counter in sorted(kinds.items())}


def _sampling(rows: list[TensorRow], policy: Policy, seed: str | None) -> dict[str, object] | None:
    """The declared sample, when K-quant reproduction was sampled: fraction, seed, detection probability."""
    sampled_rows = [row for row in rows if row.sampled_from is not None]
    if not sampled_rows or seed is None:
        return None
    return sampling_details(policy.reproduce_sample, seed, sum(row.blocks or 0 for row in sampled_rows),
                            sum(row.sampled_from or 0 for row in sampled_rows))


def _ordered(parts: list[StoragePart]) -> list[CheckedPair]:
    """Every pair's outcome exactly once, in inventory order, or a MergeError saying what is wrong."""
    shards = parts[0].shards
    if sorted(part.shard for part in parts) != list(range(shards)) or any(p.shards != shards for p in parts):
        raise MergeError(f"expected parts 0..{shards - 1}, got {sorted(part.shard for part in parts)}")
    first = parts[0]
    if any(p.pair_names != first.pair_names or p.artifact_sha256 != first.artifact_sha256 for p in parts):
        raise MergeError("the parts were made from different artifacts or inventories")
    by_index = {pair.index: pair for part in parts for pair in part.checked}
    if sorted(by_index) != list(range(len(first.pair_names))) or sum(len(p.checked) for p in parts) != len(by_index):
        raise MergeError("the parts do not cover every tensor exactly once")
    return [by_index[index] for index in range(len(first.pair_names))]


def merge_parts(parts: list[StoragePart], policy: Policy) -> tuple[GateResult, list[Blocker]]:
    """The gate's result from all its parts: rows and blockers in inventory order, then the systematic
    reclassification over every tensor (a systematic difference is a property of the whole file)."""
    parts = sorted(parts, key=lambda part: part.shard)
    checked = _ordered(parts)
    head = parts[0]
    rows = [pair.row for pair in checked if pair.row is not None]
    blockers = list(head.head_blockers) + [blocker for pair in checked for blocker in pair.blockers]
    blockers = reclassify(rows, blockers, policy.systematic_fraction, weighted=head.imatrix is not None)
    weighted = sum(pair.weighted for pair in checked)
    details = {**head.head, "check_kinds": _check_kinds(rows), "tensors": [row.model_dump() for row in rows],
               "imatrix": None if head.imatrix is None else {**head.imatrix, "tensors_weighted": weighted},
               "sampling": _sampling(rows, policy, head.artifact_sha256)}
    if head.shards > 1:
        details["shards"] = {"count": head.shards, "seconds": [round(part.seconds, 3) for part in parts]}
    status = "failed" if blockers else "passed"
    if not rows:
        why = "no GGUF tensor was compared with a source tensor: nothing was measured"
        blockers.append(Blocker(code="gate.not_run", gate="storage", why=why))
        status, details["why"] = "not_run", why
    seconds = max(part.seconds for part in parts)
    return GateResult(name="storage", status=status, seconds=seconds, details=details), blockers
