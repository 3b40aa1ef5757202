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


# --- issue 36 item 4: the estimate weighs the artifact's size, and says how far off it was -------------

GIB = 1 << 30


def test_run_time_is_fitted_to_the_artifact_size_robustly() -> None:
    from service.queue_estimate import size_fit

    seconds = [10 + 20 * size for size in (1, 2, 3, 4)] + [5000.0]  # one stalled run among honest ones
    fit = size_fit(seconds, [1 * GIB, 2 * GIB, 3 * GIB, 4 * GIB, 2 * GIB])
    assert fit is not None and fit == (10.0, 20.0)  # the median slope and intercept ignore the outlier
    known = basis(seconds, running=1, pool=None, sizes=[1 * GIB, 2 * GIB, 3 * GIB, 4 * GIB, 2 * GIB])
    assert known.expected_run_seconds(8 * GIB) == 170.0
    assert known.expected_run_seconds(None) == known.median_run_seconds == 70.0


def test_without_varied_sizes_or_with_a_nonsense_slope_every_run_takes_the_median() -> None:
    from service.queue_estimate import size_fit

    assert size_fit([10.0, 20.0, 30.0], [GIB, GIB, GIB]) is None  # one size says nothing about size
    assert size_fit([10.0, 20.0], [GIB, 2 * GIB]) is None  # too few runs
    assert size_fit([90.0, 60.0, 30.0], [GIB, 2 * GIB, 3 * GIB]) is None  # larger is faster: not a model
    assert size_fit([10.0, 20.0, 30.0], [None, None, None]) is None


def test_a_small_model_behind_a_big_one_waits_for_the_big_one() -> None:
    known = basis([30.0, 90.0, 30.0, 90.0], running=1, pool=None, sizes=[GIB, 4 * GIB, GIB, 4 * GIB])
    active = [Queued(id="big", state=State.RUNNING, run_seconds=10.0, queue_position=None, size=4 * GIB),
              Queued(id="small", state=State.QUEUED, run_seconds=None, queue_position=None, size=GIB),
              Queued(id="after", state=State.QUEUED, run_seconds=None, queue_position=None, size=GIB)]
    assert start_in_seconds(active, known) == {"small": 80.0, "after": 110.0}


def _history() -> list:
    """One worker; six runs one after another (1 and 4 GiB, 30 and 90 s), then a 4 GiB run and a 1 GiB one
    submitted a second later, which waits for it."""
    from service.queue_replay import Past

    runs, clock = [], 0.0
    for index, size in enumerate((1, 4, 1, 4, 1, 4)):
        took = 10.0 + 20.0 * size
        runs.append(Past(id=f"warm{index}", created=clock, started=clock, finished=clock + took, completed=True,
                         size=size * GIB))
        clock += took + 5.0
    runs.append(Past(id="big", created=clock, started=clock, finished=clock + 90.0, completed=True, size=4 * GIB))
    runs.append(Past(id="small", created=clock + 1, started=clock + 90, finished=clock + 120, completed=True,
                     size=GIB))
    return runs


def test_the_replay_gives_each_run_the_estimate_it_would_have_had() -> None:
    from service.queue_replay import error_of, predicted_start, replay

    runs = _history()
    small = runs[-1]
    assert predicted_start(runs, small, pool=None) == 89.0  # the 4 GiB run had 1 s of its 90 s behind it
    assert predicted_start(runs, runs[0], pool=None) is None  # nothing finished yet: no estimate
    pairs = replay(runs, pool=None)
    assert len(pairs) == 7 and all(predicted == observed for predicted, observed in pairs)
    assert error_of(pairs).median_abs_seconds == 0.0 and error_of(pairs).p90_abs_seconds == 0.0


def test_without_the_size_the_same_replay_is_off_by_the_difference() -> None:
    from service.queue_replay import Past, error_of, predicted_start

    unsized = [Past(id=p.id, created=p.created, started=p.started, finished=p.finished, completed=p.completed)
               for p in _history()]
    assert predicted_start(unsized, unsized[-1], pool=None) == 59.0  # the median run, 60 s, less the 1 s run
    error = error_of([(59.0, 89.0), (0.0, 0.0), (0.0, 0.0)])
    assert (error.runs, error.median_abs_seconds, error.p90_abs_seconds) == (3, 0.0, 30.0)
