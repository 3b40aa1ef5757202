"""Kueue's and the Job controller's conditions reduced to one phase (what the dispatcher decides on) and one
status text (what it records): the most decisive true condition wins."""

from __future__ import annotations

import pytest

from service.dispatch.kube.cluster_state import PENDING, Phase, job_status


def conditions(*true: str, reason: str | None = None) -> dict:
    return {"status": {"conditions": [{"type": kind, "status": "True", **({"reason": reason} if reason else {})}
                                      for kind in true] + [{"type": "Admitted", "status": "False"}]}}


@pytest.mark.parametrize(("workload", "phase", "status"), [
    (None, Phase.PENDING, PENDING),
    (conditions(), Phase.PENDING, PENDING),
    (conditions("Requeued"), Phase.REQUEUED, "requeued"),
    (conditions("QuotaReserved", "Requeued"), Phase.QUOTA_RESERVED, "quota reserved"),
    (conditions("QuotaReserved", "Admitted"), Phase.ADMITTED, "admitted"),
    (conditions("Admitted", "Evicted", reason="Preempted"), Phase.EVICTED, "evicted: Preempted"),
    (conditions("Evicted"), Phase.EVICTED, "evicted: unknown"),
    (conditions("Evicted", "Finished"), Phase.FINISHED, "finished"),
])
def test_a_workloads_most_decisive_condition_names_its_phase(workload, phase, status):
    found = job_status({}, workload)
    assert (found.phase, found.status, found.job_finished) == (phase, status, False)


def test_a_finished_job_outranks_its_workload():
    complete = job_status(conditions("Complete"), conditions("Evicted"))
    assert (complete.phase, complete.status, complete.job_finished) == (Phase.JOB_COMPLETE, "job complete", True)
    failed = job_status(conditions("Failed", reason="BackoffLimitExceeded"), conditions("Admitted"))
    assert (failed.phase, failed.status, failed.job_failed_reason) == (
        Phase.JOB_FAILED, "job failed: BackoffLimitExceeded", "BackoffLimitExceeded")
    assert job_status(conditions("Failed"), None).job_failed_reason == "Failed"
