"""SIGTERM ends open event streams and the process exits within its grace period, under load (issue 34,
item 3). Before, `convgate serve` with 16 streams open was still running 60 s after SIGTERM: uvicorn waits
for every response to finish, and a stream on a verification that is not moving never finishes."""

from __future__ import annotations

import asyncio
import signal
import uuid

import httpx

from service.auth import Role, digest, new_secret
from service.persistence import repository, tokens
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.serve_process import serve_process

STREAMS = 16
GRACE_SECONDS = 10  # shutdown_grace_seconds: what requests in flight get before they are cancelled
# Streams end at their next poll (0.5 s) and the requests in flight are short: the process is gone long
# before the grace period runs out; the bound is the grace period itself.
EXIT_LIMIT_SECONDS = GRACE_SECONDS


def _seed(url: str) -> tuple[list[tuple[str, str]], str]:
    """(token, queued verification) per stream (8 streams per token at most), and an admin token."""
    engine = make_engine(url)
    try:
        with transaction(session_factory(engine)) as session:
            pairs = []
            for index in range(STREAMS):
                if index % 8 == 0:
                    secret, name = new_secret(), f"streamer-{uuid.uuid4().hex[:6]}"
                    tokens.add_token(session, name, Role.SUBMITTER.value, digest(secret))
                verification = repository.insert_unless_known(
                    session, submitted_by=name, idempotency_key=f"s-{index}", request_sha256="a" * 64,
                    request={"source_uri": "hf://o/s@" + "0" * 40, "artifact_uri": "hf://o/m@" + "0" * 40 + "/m",
                             "artifact_sha256": "e" * 64}, policy={"version": "1"}, policy_sha256="b" * 64,
                    max_attempts=3)
                assert verification is not None
                pairs.append((secret, verification.id))
            admin = new_secret()
            tokens.add_token(session, "admin", Role.ADMIN.value, digest(admin))
        return pairs, admin
    finally:
        engine.dispose()


async def _stream(client: httpx.AsyncClient, token: str, verification_id: str, opened: asyncio.Event) -> bytes:
    """The stream's whole body; it must end cleanly (a cut connection raises)."""
    received = b""
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    async with client.stream("GET", f"/v1/verifications/{verification_id}/events", headers=headers) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_bytes():
            received += chunk
            opened.set()
    return received


async def _load(client: httpx.AsyncClient, admin: str, verification_id: str, stop: asyncio.Event) -> int:
    """Reads, one after another, until the server stops answering: the load the shutdown happens under."""
    answered = 0
    while not stop.is_set():
        try:
            await client.get(f"/v1/verifications/{verification_id}", headers={"Authorization": f"Bearer {admin}"})
        except httpx.HTTPError:
            return answered
        answered += 1
    return answered


async def _shut_down_under_load(server, pairs: list[tuple[str, str]], admin: str) -> tuple[list[bytes], float]:
    limits = httpx.Limits(max_connections=STREAMS + 20)
    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60) as client:
        opened = [asyncio.Event() for _ in pairs]
        streams = [asyncio.create_task(_stream(client, token, verification_id, event))
                   for (token, verification_id), event in zip(pairs, opened, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in opened)), timeout=60)
        stop = asyncio.Event()
        load = [asyncio.create_task(_load(client, admin, pairs[0][1], stop)) for _ in range(8)]
        await asyncio.sleep(0)  # let the load start before the signal
        exited = await asyncio.to_thread(server.stop, EXIT_LIMIT_SECONDS)
        stop.set()
        bodies = await asyncio.wait_for(asyncio.gather(*streams), timeout=10)
        await asyncio.gather(*load)
    return bodies, exited


def test_sigterm_ends_open_streams_and_exits_within_the_grace_period(sqlite_url, tmp_path):
    pairs, admin = _seed(sqlite_url)
    with serve_process(sqlite_url, tmp_path, shutdown_grace_seconds=str(GRACE_SECONDS)) as server:
        bodies, exited = asyncio.run(_shut_down_under_load(server, pairs, admin))
        # uvicorn ends by raising the signal it caught once it has shut down: SIGTERM's own status
        assert server.process.returncode == -signal.SIGTERM, server.output()[-2000:]
    print(f"\n{STREAMS} streams open, 8 clients reading: exited {exited:.1f} s after SIGTERM")
    assert exited < EXIT_LIMIT_SECONDS
    for body in bodies:  # each got its first event, then the end that tells it to reconnect
        assert body.startswith(b"id: ") and body.endswith(b": the server is stopping: reconnect with Last-Event-ID\n\n")


def test_with_two_api_processes_sigterm_still_ends_every_stream_and_exits(pg, tmp_path):
    """`--workers 2`: uvicorn's supervisor passes SIGTERM to each API process, whose streams end the same way;
    the supervisor (the dispatcher's process) exits once both have."""
    pairs, admin = _seed(pg)
    with serve_process(pg, tmp_path, "--workers", "2", shutdown_grace_seconds=str(GRACE_SECONDS)) as server:
        bodies, exited = asyncio.run(_shut_down_under_load(server, pairs, admin))
    print(f"\n2 API processes, {STREAMS} streams open: exited {exited:.1f} s after SIGTERM")
    assert exited < EXIT_LIMIT_SECONDS
    assert all(body.endswith(b"reconnect with Last-Event-ID\n\n") for body in bodies)


def test_a_stream_told_to_stop_resumes_after_its_last_event_elsewhere(sqlite_url, tmp_path):
    """What the client does next: reconnect with Last-Event-ID (to another replica; here, a new server)
    and get nothing twice."""
    pairs, _admin = _seed(sqlite_url)
    token, verification_id = pairs[0]
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    with serve_process(sqlite_url, tmp_path) as server, \
            httpx.stream("GET", f"{server.url}/v1/verifications/{verification_id}/events", headers=headers,
                         timeout=60) as response:
        chunks = response.iter_bytes()
        first = next(chunks)
        server.stop(EXIT_LIMIT_SECONDS)
        rest = b"".join(chunks)
    last_id = first.split(b"\n", 1)[0].removeprefix(b"id: ").decode()
    assert rest.endswith(b"reconnect with Last-Event-ID\n\n")
    with transaction(session_factory(make_engine(sqlite_url))) as session:
        repository.cancel(session, verification_id, "test")
    with serve_process(sqlite_url, tmp_path) as again:
        resumed = httpx.get(f"{again.url}/v1/verifications/{verification_id}/events",
                            headers=headers | {"Last-Event-ID": last_id}, timeout=60).content
    assert b"event: cancelled" in resumed and b"event: queued" not in resumed, resumed
