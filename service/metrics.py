"""Prometheus metrics computed from the database at scrape time, so every API replica reports the
same numbers and workers (other processes, other pods) need no metrics endpoint of their own.

Every counter here counts append-only rows (events, verdicts, deliveries), so it only grows; every API
replica exports the same value, which is why the chart's rules take `max` over replicas, not `sum`.
When the database does not answer, the scrape still succeeds with `convgate_database_up 0` and the
in-process metrics (`service/api/http_metrics.py`), so the alert on the database is not lost with it.
The names are a contract: the chart's alert rules and dashboard use them, and a test scrapes them
after a real verification (tests/deploy/test_monitoring_names.py)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import exc as db_errors
from sqlalchemy.orm import Session, sessionmaker

from engine.blockers import BLOCKER_CODES
from service.lifecycle import Reason, State
from service.persistence import stats
from service.persistence.clock import as_utc, now
from service.persistence.db import read_transaction
from service.persistence.queue_history import history
from service.queue_replay import predicted_start, replayed_error

log = logging.getLogger(__name__)
GATE_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# NO-GO verdicts that say convgate could not do its job, not that the artifact is wrong: a gate that could
# not run, llama.cpp dying under the verifier, a missing reference, the verifier's own self-checks failing
INTERNAL_CODES = ("gate.not_run", "runtime.crashed", "verifier.reference_missing", "verifier.reader_disagreement",
                  "verifier.control_not_detected")
# how a failed attempt ended, as the attempt-failure counter labels it
FAILURE_LABELS = {Reason.WORKER_ERROR: "worker_error", Reason.WORKER_EXITED: "crashed",
                  Reason.HEARTBEAT_LOST: "heartbeat_lost", Reason.DISPATCHER_RESTARTED: "dispatcher_restarted",
                  Reason.JOB_LOST: "job_lost"}
OOM_KILLED = "oom_killed"
FAMILIES = tuple(sorted({code.split(".", 1)[0] for code in BLOCKER_CODES}))  # every family exported, 0 or not


class DatabaseCollector(Collector):
    def __init__(self, factory: sessionmaker[Session], pool: int | None = None) -> None:
        self.factory = factory
        self.pool = pool  # the local dispatcher's workers (None on Kubernetes): the estimate's parallelism

    def collect(self) -> Iterator[Metric]:
        try:
            with read_transaction(self.factory) as session:  # a scrape only reads: never SQLite's write lock
                families = list(self._families(session))
        except (db_errors.OperationalError, db_errors.TimeoutError, db_errors.InterfaceError) as exc:
            log.warning("metrics: database unavailable: %s", type(exc).__name__)
            families = []
        up = GaugeMetricFamily("convgate_database_up", "1 when the database answered this scrape's queries")
        up.add_metric([], 1 if families else 0)
        yield up
        yield from families

    def _families(self, session: Session) -> Iterator[Metric]:
        yield from _lifecycle(session)
        yield from _verdicts(session)
        yield from _queue(session, self.pool)
        deliveries = stats.callback_deliveries(session)
        callbacks = CounterMetricFamily("convgate_callback_deliveries", "Completion callback delivery attempts, "
                                        "by outcome (delivered: a 2xx answer)", labels=["outcome"])
        callbacks.add_metric(["delivered"], deliveries.get(True, 0))
        callbacks.add_metric(["failed"], deliveries.get(False, 0))
        yield callbacks


def _lifecycle(session: Session) -> Iterator[Metric]:
    counts = stats.state_counts(session)
    depth = GaugeMetricFamily("convgate_verifications", "Verifications by state", labels=["state"])
    for state in State:
        depth.add_metric([state.value], counts.get(state.value, 0))
    yield depth
    yield CounterMetricFamily("convgate_attempts_started", "Attempts whose worker started (admitted and running)",
                              value=stats.attempts_started(session))
    failures = CounterMetricFamily("convgate_attempt_failures", "Attempts that ended without a verdict and "
                                   "counted as failed, by how they ended", labels=["reason"])
    by_label = dict.fromkeys([*FAILURE_LABELS.values(), OOM_KILLED], 0)
    for (code, oom_killed), count in stats.attempt_failures(session).items():
        label = OOM_KILLED if oom_killed else FAILURE_LABELS[Reason(code)]
        by_label[label] += count
    for label, count in sorted(by_label.items()):
        failures.add_metric([label], count)
    yield failures


def _verdicts(session: Session) -> Iterator[Metric]:
    verdicts = stats.verdict_counts(session)
    results = CounterMetricFamily("convgate_verdicts", "Verdicts written, by result", labels=["verdict"])
    for verdict in ("GO", "NO-GO"):
        results.add_metric([verdict], verdicts.get(verdict, 0))
    yield results
    families = dict.fromkeys(FAMILIES, 0)
    internal = dict.fromkeys(INTERNAL_CODES, 0)
    for codes_json, count in stats.nogo_blocker_sets(session).items():
        codes = [str(code) for code in json.loads(codes_json or "[]")]
        for family in {code.split(".", 1)[0] for code in codes}:
            families[family] = families.get(family, 0) + count  # a code outside the table still counts
        for code in set(codes) & internal.keys():
            internal[code] += count
    by_family = CounterMetricFamily("convgate_nogo_verdicts_by_family", "NO-GO verdicts with a blocker of this "
                                    "family (the code's first part); one verdict counts in each of its families",
                                    labels=["family"])
    for family, count in sorted(families.items()):
        by_family.add_metric([family], count)
    yield by_family
    internal_family = CounterMetricFamily("convgate_internal_nogo_verdicts", "NO-GO verdicts for an internal "
                                          "reason (the verifier could not run a check), by blocker code",
                                          labels=["code"])
    for code, count in internal.items():
        internal_family.add_metric([code], count)
    yield internal_family
    histogram = stats.gate_duration_histogram(session, GATE_BUCKETS)
    durations = HistogramMetricFamily("convgate_gate_duration_seconds", "Gate wall time", labels=["gate"])
    for gate, (cumulative, total, seconds) in sorted(histogram.items()):
        buckets = [(str(bound), count) for bound, count in zip(GATE_BUCKETS, cumulative, strict=True)]
        durations.add_metric([gate], [*buckets, ("+Inf", total)], seconds)
    yield durations


def _queue(session: Session, pool: int | None) -> Iterator[Metric]:
    """How long the oldest waiting verification has waited, what the estimate gave it when it was
    submitted (replayed: `service/queue_replay.py`), and the estimator's error on the latest runs."""
    oldest = stats.oldest_waiting(session)
    past = history(session)
    waited, expected = 0.0, math.nan
    if oldest is not None:
        waited = (now(session) - as_utc(oldest.created_at)).total_seconds()
        target = next((p for p in past if p.id == oldest.id), None)
        predicted = None if target is None else predicted_start(past, target, pool)
        expected = math.nan if predicted is None else predicted
    yield GaugeMetricFamily("convgate_queue_oldest_waiting_seconds", "How long the oldest verification not yet "
                            "started has waited since submission (0: none waits)", value=waited)
    yield GaugeMetricFamily("convgate_queue_oldest_expected_wait_seconds", "The wait the start estimate gave the "
                            "oldest waiting verification at its submission (NaN: no estimate)", value=expected)
    error = replayed_error(tuple(past), pool)
    errors = GaugeMetricFamily("convgate_queue_estimate_error_seconds", "Absolute error of the start estimate on "
                               "a replay of the latest finished runs (NaN: none replayed)", labels=["quantile"])
    for quantile, value in (("0.5", error.median_abs_seconds), ("0.9", error.p90_abs_seconds)):
        errors.add_metric([quantile], math.nan if value is None else value)
    yield errors


def make_registry(factory: sessionmaker[Session], *collectors: Collector, pool: int | None = None) -> CollectorRegistry:
    """The app's own registry (not the process-wide default, so two apps in one process never collide):
    the database's metrics and `collectors` (the API's in-process ones)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(factory, pool))
    for collector in collectors:
        registry.register(collector)
    return registry
