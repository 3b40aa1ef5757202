"""What scripts/soak.py adds to its steady load (issue 34): bursts of 200 concurrent authenticated clients
mixed over every read and write route with a full house of event streams open, and completion callbacks to
two receivers, one of which is a tarpit.

- `burst` fires the 200-client mix (as tests/service/test_concurrency.py does, at soak scale): submissions,
  reads of one verification, its events, report, attestation and callbacks, the auditor's list, the access
  log and the export, the queue, a callback secret, cancels, the operator and auditor pages, /metrics and
  /readyz, while `STREAMS` extra event streams are held open. Each burst records its statuses and latencies.
- `Receivers` runs the two callback receivers on loopback: a prompt one, which records when each callback
  arrived (so the soak reports how long after its verification ended a callback went out), and a tarpit,
  which accepts and then answers one byte every few seconds, never finishing, so every delivery to it ends
  at the delivery's deadline.
"""

from __future__ import annotations

import asyncio
import json
import random
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

CLIENTS = 200
# tests/service/test_concurrency.py holds 10 s; here worker processes run, and a dispatcher restarts, beside it
BURST_P99_LIMIT = 15.0
BURSTS_AT = (0.15, 0.4, 0.6, 0.85)  # of the run; the database refuses at 0.5
CALLBACK_P90_LIMIT = 15.0  # seconds from a verification's end to its callback at the prompt receiver
STREAMS = 56  # beside the soak's 6 watchers: 62 of the server's 64
STREAMERS = 7  # tokens holding 8 streams each (MAX_STREAMS_PER_PRINCIPAL)
TARPIT_BYTE_SECONDS = 3.0


@dataclass
class Burst:
    """One burst's outcome: statuses and latencies of its requests, and the streams held through it."""

    at: float
    statuses: dict[int, int] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    transport_errors: int = 0
    streams_held: int = 0

    def p(self, q: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _routes(tokens: dict[str, str], files: Path, mine: list[str],
            done: str | None) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(method, path, token, httpx arguments) over every route; `mine`: the burst submitter's own new
    verifications (read and cancelled), `done`: a finished one (report, attestation) if there is one."""
    one = mine[0]
    routes = [
        ("POST", "/v1/verifications", tokens["burst"], {"json": submission(files)}),
        ("GET", f"/v1/verifications/{one}", tokens["burst"], {}),
        ("GET", f"/v1/verifications/{one}/events", tokens["burst"], {}),
        ("GET", f"/v1/verifications/{one}/callbacks", tokens["burst"], {}),
        ("GET", "/v1/verifications", tokens["auditor"], {"params": {"limit": 50}}),
        ("GET", "/v1/access-log", tokens["auditor"], {"params": {"limit": 20}}),
        ("GET", "/v1/verdicts/export", tokens["auditor"], {"params": {"since": "2026-01-01T00:00:00Z"}}),
        ("GET", "/v1/queue", tokens["operator"], {}),
        ("POST", "/v1/callback-secret", tokens["burst"], {}),
        ("POST", f"/v1/verifications/{random.choice(mine)}/cancel", tokens["burst"], {}),
        ("GET", "/ui/queue", tokens["operator"], {}),
        ("GET", "/ui/queue/table", tokens["operator"], {}),
        ("GET", "/ui/auditor", tokens["auditor"], {"params": {"verdict": "NO-GO"}}),
        ("GET", "/metrics", tokens["operator"], {}),
        ("GET", "/readyz", "", {}),
    ]
    if done is not None:
        routes += [("GET", f"/v1/verifications/{done}/report", tokens["auditor"], {}),
                   ("GET", f"/v1/verifications/{done}/attestation", tokens["auditor"], {}),
                   ("GET", f"/ui/verifications/{done}/report", tokens["auditor"], {})]
    return routes


async def _hold_stream(client: httpx.AsyncClient, token: str, verification_id: str, opened: asyncio.Event,
                       release: asyncio.Event) -> bool:
    """Open a stream and read it until `release` (or until it ends, with its verification); False when the
    server refused or cut it."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    try:
        async with client.stream("GET", f"/v1/verifications/{verification_id}/events", headers=headers) as stream:
            if stream.status_code != 200:
                return False
            opened.set()
            reading = asyncio.ensure_future(stream.aread())
            released = asyncio.ensure_future(release.wait())
            await asyncio.wait({reading, released}, return_when=asyncio.FIRST_COMPLETED)
            released.cancel()
            if reading.done():
                reading.result()  # a cut stream raises here
            else:
                reading.cancel()
            return True
    except httpx.HTTPError:
        return False
    finally:
        opened.set()


async def burst(url: str, tokens: dict[str, str], streamers: list[str], files: Path, started: float) -> Burst:
    """The 200-client mix with `STREAMS` streams held through it, on verifications the burst submits first
    (each stream runs until the burst ends or its verification does)."""
    outcome = Burst(at=time.monotonic() - started)
    limits = httpx.Limits(max_connections=CLIENTS + STREAMS + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        queued = await _queued_of(client, tokens["burst"], files, 8)
        done = await _finished(client, tokens["auditor"])
        release = asyncio.Event()
        opened = [asyncio.Event() for _ in range(STREAMS)]
        holders = [asyncio.create_task(_hold_stream(client, streamers[n // 8], queued[n % len(queued)],
                                                    opened[n], release)) for n in range(STREAMS)]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), timeout=120)
        routes = _routes(tokens, files, queued, done)

        async def call(method: str, path: str, token: str, extra: dict[str, Any]) -> None:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            begun = time.perf_counter()
            try:
                response = await client.request(method, path, headers=headers, **extra)
            except httpx.HTTPError:
                outcome.transport_errors += 1
                return
            outcome.seconds.append(time.perf_counter() - begun)
            outcome.statuses[response.status_code] = outcome.statuses.get(response.status_code, 0) + 1
            if method == "POST" and path == "/v1/verifications" and response.status_code == 202:
                queued.append(response.json()["id"])

        await asyncio.gather(*(call(*routes[n % len(routes)]) for n in range(CLIENTS)))
        release.set()
        outcome.streams_held = sum(await asyncio.gather(*holders))  # neither refused nor cut
        for verification_id in queued:  # what the burst made is not the soak's work: no worker runs it
            await client.post(f"/v1/verifications/{verification_id}/cancel",
                              headers={"Authorization": f"Bearer {tokens['burst']}"})
    return outcome


def submission(files: Path) -> dict[str, Any]:
    """A submission the soak's worker pool ends quickly: a wrong digest is NO-GO once the file is hashed."""
    return {"source_uri": (files / "source").as_uri(), "artifact_uri": (files / "model.gguf").as_uri(),
            "artifact_sha256": uuid.uuid4().hex * 2, "gates": [1]}


async def _queued_of(client: httpx.AsyncClient, token: str, files: Path, count: int) -> list[str]:
    """`count` new verifications of the burst submitter, to stream, read and cancel."""
    made = []
    for _ in range(count):
        response = await client.post("/v1/verifications", json=submission(files),
                                     headers={"Authorization": f"Bearer {token}"})
        response.raise_for_status()
        made.append(response.json()["id"])
    return made


async def _finished(client: httpx.AsyncClient, token: str) -> str | None:
    response = await client.get("/v1/verifications", params={"state": "completed", "limit": 1},
                                headers={"Authorization": f"Bearer {token}"})
    items = response.json().get("items", []) if response.status_code == 200 else []
    return items[0]["id"] if items else None


class Receivers:
    """The soak's two callback receivers on loopback: prompt (recording each arrival) and a tarpit."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[str, float]] = []  # (verification id, seconds after it finished)
        self.tarpit_connections = 0
        self.tarpit_most_at_once = 0
        self._held = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        receivers = self

        class Prompt(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                finished = datetime.fromisoformat(body["verification"]["finished_at"]).timestamp()
                receivers.arrivals.append((body["verification"]["id"], time.time() - finished))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        self.prompt = ThreadingHTTPServer(("127.0.0.1", 0), Prompt)
        self.prompt_origin = f"http://127.0.0.1:{self.prompt.server_address[1]}"
        threading.Thread(target=self.prompt.serve_forever, daemon=True).start()
        self.tarpit = socket.create_server(("127.0.0.1", 0))
        self.tarpit_origin = f"http://127.0.0.1:{self.tarpit.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection, _ = self.tarpit.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection: socket.socket) -> None:
        with self._lock:
            self.tarpit_connections += 1
            self._held += 1
            self.tarpit_most_at_once = max(self.tarpit_most_at_once, self._held)
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Tarpit: " + b"z" * 10_000:
                deadline = time.monotonic() + TARPIT_BYTE_SECONDS
                while (left := deadline - time.monotonic()) > 0:  # the request is read and dropped meanwhile
                    if select.select([connection], [], [], left)[0] and not connection.recv(65536):
                        return  # the sender gave up at its deadline
                if self._closed.is_set():
                    return
                connection.sendall(bytes([byte]))
        except OSError:
            pass
        finally:
            with self._lock:
                self._held -= 1
            connection.close()

    def close(self) -> None:
        self._closed.set()
        self.prompt.shutdown()
        self.prompt.server_close()
        self.tarpit.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def check_bursts(done: list[Burst]) -> list[str]:
    """Each burst: no 5xx at all (the database was healthy), p99 under the limit, no stream refused or cut."""
    problems = []
    if len(done) != len(BURSTS_AT):
        problems.append(f"{len(done)} of {len(BURSTS_AT)} bursts ran")
    for index, each in enumerate(done):
        if failed := {code: n for code, n in each.statuses.items() if code >= 500}:
            problems.append(f"burst {index + 1}: {failed}")
        if each.transport_errors or not each.p(0.99) < BURST_P99_LIMIT:
            problems.append(f"burst {index + 1}: p99 {each.p(0.99):.2f}s, {each.transport_errors} transport errors")
        if each.streams_held != STREAMS:
            problems.append(f"burst {index + 1}: {STREAMS - each.streams_held} streams refused or cut")
    return problems


def check_callbacks(prompt: list[str], final: dict[str, dict], receivers: Receivers) -> list[str]:
    """Every ended verification of `prompt` called back, 90% within CALLBACK_P90_LIMIT of their end."""
    missing = {v for v in prompt if v in final} - {verification_id for verification_id, _ in receivers.arrivals}
    problems = [f"{len(missing)} callbacks to the prompt receiver never arrived"] if missing else []
    p90 = percentile([seconds for _, seconds in receivers.arrivals], 0.9)
    if not p90 < CALLBACK_P90_LIMIT:
        problems.append(f"prompt callbacks p90 {p90:.1f}s after their verification ended")
    return problems


def wait_for_callbacks(prompt: list[str], receivers: Receivers, final: dict[str, dict], seconds: float) -> None:
    """After the drain: until every ended verification's prompt callback arrived, or `seconds` passed."""
    deadline = time.monotonic() + seconds
    expected = {v for v in prompt if v in final}
    while time.monotonic() < deadline and not expected <= {v for v, _ in receivers.arrivals}:
        time.sleep(1)


def summary(bursts_done: list[Burst], receivers: Receivers) -> dict[str, object]:
    latencies = [seconds for _, seconds in receivers.arrivals]
    return {"bursts": [{"at": round(each.at), "statuses": each.statuses, "p50": round(each.p(0.5), 3),
                        "p99": round(each.p(0.99), 3), "max": round(each.p(1.0), 3),
                        "streams_held": each.streams_held, "transport_errors": each.transport_errors}
                       for each in bursts_done],
            "callbacks": {"prompt_delivered": len(receivers.arrivals),
                          "prompt_after_end_p50": round(percentile(latencies, 0.5), 2),
                          "prompt_after_end_p99": round(percentile(latencies, 0.99), 2),
                          "prompt_after_end_max": round(max(latencies, default=float("nan")), 2),
                          "tarpit_connections": receivers.tarpit_connections,
                          "tarpit_most_at_once": receivers.tarpit_most_at_once}}
