"""The API's own metrics, counted in-process (each replica its own; rules `sum` them): how long each
route takes to answer, and how often the database was unavailable to a request (the 503s of
`app.database_unavailable`). These are the ones the database cannot count, least of all while it is down.

Latency is the time until the response's status line is sent, not until its last byte: event streams
and exports stream for as long as they last, and their time to first byte is what a client waits for.
The route is the path template (`/v1/verifications/{verification_id}`), so ids never become labels."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class HttpMetrics:
    """The API's counters, registered in the app's own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.latency = Histogram("convgate_http_request_duration_seconds", "Time until the response status was "
                                 "sent, by route template, method and status", ["route", "method", "status"],
                                 buckets=LATENCY_BUCKETS, registry=registry)
        self.database_unavailable = Counter("convgate_database_unavailable_responses", "Requests answered 503 "
                                            "because the database was unavailable", registry=registry)


class HttpMetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware): one clock read at each end and one observation per request."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                self.metrics.latency.labels(template, scope["method"], str(message["status"])).observe(
                    time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed)
