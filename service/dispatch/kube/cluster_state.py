"""What Kueue and the Job controller say, reduced to one status per verification.

Workload conditions (kueue.x-k8s.io/v1beta2): QuotaReserved, Admitted, Evicted, Requeued, Finished;
Job conditions: Complete, Failed. The most decisive true condition wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PENDING = "pending admission"


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    status: str  # e.g. "admitted", "evicted: Preempted"
    job_finished: bool = False
    job_failed_reason: str | None = None


def _true(conditions: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conditions or [] if c.get("status") == "True"}


def workload_status(workload: dict[str, Any] | None) -> str:
    if workload is None:
        return PENDING
    true = _true(workload.get("status", {}).get("conditions"))
    if "Finished" in true:
        return "finished"
    if "Evicted" in true:
        return f"evicted: {true['Evicted'].get('reason', 'unknown')}"
    if "Admitted" in true:
        return "admitted"
    if "QuotaReserved" in true:
        return "quota reserved"
    if "Requeued" in true:
        return "requeued"
    return PENDING


def job_status(job: dict[str, Any], workload: dict[str, Any] | None) -> ClusterStatus:
    true = _true(job.get("status", {}).get("conditions"))
    if "Complete" in true:
        return ClusterStatus("job complete", job_finished=True)
    if "Failed" in true:
        reason = true["Failed"].get("reason") or "Failed"
        return ClusterStatus(f"job failed: {reason}", job_finished=True, job_failed_reason=reason)
    return ClusterStatus(workload_status(workload))
