"""When a waiting verification is expected to start (issue 25 item 4): the median of recent runs, as many
at once as run now (or the local pool's workers), running ones finishing after the median, waiting ones
starting in queue order as slots free up; no history, no estimate."""

from __future__ import annotations

from service.lifecycle import State
from service.queue_estimate import Basis, Queued, basis, start_in_seconds


def _waiting(name: str, position: int | None = None, state: str = State.QUEUED) -> Queued:
    return Queued(id=name, state=state, run_seconds=None, queue_position=position)


def _running(name: str, ran: float) -> Queued:
    return Queued(id=name, state=State.RUNNING, run_seconds=ran, queue_position=None)


def test_the_median_and_the_observed_parallelism_are_the_basis() -> None:
    assert basis([10.0, 30.0, 1000.0], running=2, pool=None) == Basis(runs=3, median_run_seconds=30.0, parallel=2)
    assert basis([], running=0, pool=None) == Basis(runs=0, median_run_seconds=None, parallel=1)
    assert basis([5.0], running=1, pool=4).parallel == 4  # the local pool's workers, whatever runs now


def test_waiting_ones_start_as_running_ones_finish_in_queue_order() -> None:
    active = [_running("r1", ran=20.0), _running("r2", ran=50.0), _waiting("q1"), _waiting("q2"), _waiting("q3")]
    starts = start_in_seconds(active, Basis(runs=5, median_run_seconds=60.0, parallel=2))
    assert starts == {"q1": 10.0, "q2": 40.0, "q3": 70.0}  # r2 frees at 10 s, r1 at 40 s, then q1's slot at 70 s


def test_kueue_positions_and_dispatched_jobs_come_first() -> None:
    active = [_waiting("late", position=1), _waiting("early", position=0), _waiting("fresh"),
              _waiting("held", state=State.DISPATCHED)]
    starts = start_in_seconds(active, Basis(runs=1, median_run_seconds=100.0, parallel=1))
    assert sorted(starts, key=starts.__getitem__) == ["held", "early", "late", "fresh"]
    assert starts["held"] == 0.0 and starts["fresh"] == 300.0


def test_an_overrunning_job_is_expected_to_finish_now_and_no_history_gives_no_estimate() -> None:
    active = [_running("slow", ran=500.0), _waiting("next")]
    assert start_in_seconds(active, Basis(runs=2, median_run_seconds=60.0, parallel=1)) == {"next": 0.0}
    assert start_in_seconds(active, Basis(runs=0, median_run_seconds=None, parallel=1)) == {}
