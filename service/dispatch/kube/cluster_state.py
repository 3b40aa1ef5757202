"""What Kueue and the Job controller say, reduced to one status per verification.

Workload conditions (kueue.x-k8s.io/v1beta2): QuotaReserved, Admitted, Evicted, Requeued, Finished;
Job conditions: Complete, Failed. The most decisive true condition wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

PENDING = "pending admission"


class Phase(StrEnum):
    """Where a verification's Job stands: what the dispatcher decides on (the status text is what it records)."""

    PENDING = "pending"
    REQUEUED = "requeued"
    QUOTA_RESERVED = "quota reserved"
    ADMITTED = "admitted"
    EVICTED = "evicted"
    FINISHED = "finished"
    JOB_COMPLETE = "job complete"
    JOB_FAILED = "job failed"


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    phase: Phase
    status: str  # recorded and shown: e.g. "admitted", "evicted: Preempted"
    job_finished: bool = False
    job_failed_reason: str | None = None


def _true(conditions: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conditions or [] if c.get("status") == "True"}


def workload_status(workload: dict[str, Any] | None) -> ClusterStatus:
    true = _true((workload or {}).get("status", {}).get("conditions"))
    if "Evicted" in true and "Finished" not in true:
        return ClusterStatus(Phase.EVICTED, f"evicted: {true['Evicted'].get('reason', 'unknown')}")
    for condition, phase in (("Finished", Phase.FINISHED), ("Admitted", Phase.ADMITTED),
                             ("QuotaReserved", Phase.QUOTA_RESERVED), ("Requeued", Phase.REQUEUED)):
        if condition in true:
            return ClusterStatus(phase, phase.value)
    return ClusterStatus(Phase.PENDING, PENDING)


def job_status(job: dict[str, Any], workload: dict[str, Any] | None) -> ClusterStatus:
    true = _true(job.get("status", {}).get("conditions"))
    if "Complete" in true:
        return ClusterStatus(Phase.JOB_COMPLETE, "job complete", job_finished=True)
    if "Failed" in true:
        reason = true["Failed"].get("reason") or "Failed"
        return ClusterStatus(Phase.JOB_FAILED, f"job failed: {reason}", job_finished=True, job_failed_reason=reason)
    return workload_status(workload)
