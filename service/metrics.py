"""Prometheus metrics computed from the database at scrape time, so every API replica reports the
same numbers and workers (other processes, other pods) need no metrics endpoint of their own."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy.orm import Session, sessionmaker

from service.lifecycle import State
from service.persistence import stats

GATE_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class DatabaseCollector(Collector):
    def __init__(self, factory: sessionmaker[Session]) -> None:
        self.factory = factory

    def collect(self) -> Iterator:
        with self.factory() as session:
            counts = stats.state_counts(session)
            verdicts = stats.verdict_counts(session)
            histogram = stats.gate_duration_histogram(session, GATE_BUCKETS)
        depth = GaugeMetricFamily("convgate_verifications", "Verifications by state", labels=["state"])
        for state in State:
            depth.add_metric([state.value], counts.get(state.value, 0))
        yield depth
        results = CounterMetricFamily("convgate_verdicts", "Verdicts written, by result", labels=["verdict"])
        for verdict in ("GO", "NO-GO"):
            results.add_metric([verdict], verdicts.get(verdict, 0))
        yield results
        durations = HistogramMetricFamily("convgate_gate_duration_seconds", "Gate wall time", labels=["gate"])
        for gate, (cumulative, total, seconds) in sorted(histogram.items()):
            buckets = [(str(bound), count) for bound, count in zip(GATE_BUCKETS, cumulative, strict=True)]
            durations.add_metric([gate], [*buckets, ("+Inf", total)], seconds)
        yield durations


def make_registry(factory: sessionmaker[Session]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(factory))
    return registry
