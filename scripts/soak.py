#!/usr/bin/env python3
"""Load and faults against the running service: does it stay responsive, and does every verification end?

Two `convgate serve` processes share one database, as a platform runs them: an API-only replica that
every client talks to, and a dispatching replica (the local worker pool) that is killed and restarted
twice during the run. Against the API, at once: submitters (real worker runs: most with a wrong digest,
which ends NO-GO after hashing, some whole gate-1 runs when --artifact is a real GGUF), SSE watchers on
their own verifications, auditors paging and exporting, and a flood of bogus sign-ins. Halfway, the
database refuses connections for a few seconds (Postgres: the database closed to new connections and
its sessions ended; SQLite: another process holds an exclusive lock). A prober times /healthz all along.

Four times during the run (never while the database refuses), 200 concurrent clients fire a mix over every
read and write route with 56 more event streams open (`soak_mix.burst`). One submitter's verifications
call back to a tarpit that trickles one byte every few seconds and never finishes, another's to a prompt
receiver (`soak_mix.Receivers`).

It asserts that /healthz p99 stays under 1 s, that no response is a 5xx other than a declared 503, that no
burst saw a 503 (the database was healthy) or a p99 over 15 s or had a stream refused or cut, that the prompt
receiver's callbacks were not held up by the tarpit (90% within 15 s of their verification's end, and every
one delivered), and that, once submissions stop and the queue drains, every verification ended with
exactly one verdict or a recorded failure. Usage:

    python scripts/soak.py --database sqlite --minutes 10
    python scripts/soak.py --database postgres --minutes 10   # CONVGATE_TEST_PG: an admin DSN
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from soak_mix import (
    BURSTS_AT,
    STREAMERS,
    Burst,
    Receivers,
    burst,
    check_bursts,
    check_callbacks,
    percentile,
    summary,
    wait_for_callbacks,
)
from throwaway_server import ADMIN, drop_database, free_port, wait_ready

HEALTH_P99_LIMIT = 1.0
TERMINAL = {"completed", "failed", "cancelled"}


@dataclass
class Tally:
    """What the clients saw."""

    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    health: list[float] = field(default_factory=list)
    submitted: list[str] = field(default_factory=list)
    transport_errors: Counter[str] = field(default_factory=Counter)
    bursts: list[Burst] = field(default_factory=list)
    prompt_callbacks: list[str] = field(default_factory=list)  # verifications whose callback goes to the prompt one

    def saw(self, who: str, response: httpx.Response) -> None:
        self.statuses[(who, response.status_code)] += 1

    def server_errors(self) -> dict[str, int]:
        return {f"{who} {code}": n for (who, code), n in self.statuses.items() if code >= 500 and code != 503}


@dataclass
class Deployment:
    database_url: str
    env: dict[str, str]
    api_url: str
    tokens: dict[str, str]
    logs: Path
    dispatcher: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    def start_dispatcher(self) -> None:
        log = (self.logs / f"dispatcher-{self.restarts}.log").open("wb")
        env = self.env | {"CONVGATE_DISPATCHER": "local"}
        self.dispatcher = subprocess.Popen([convgate(), "serve", "--port", str(free_port()), "--no-migrate"],
                                           env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def restart_dispatcher(self) -> None:
        """Killed, as a node loses a pod: its running workers lose their lease and are retried."""
        assert self.dispatcher is not None
        os.killpg(self.dispatcher.pid, signal.SIGKILL)
        self.dispatcher.wait()
        self.restarts += 1
        self.start_dispatcher()


def convgate() -> str:
    return os.path.join(os.path.dirname(sys.executable), "convgate")


@contextmanager
def database(kind: str):
    """(SQLAlchemy URL, a function that refuses connections for `seconds`), dropped afterwards."""
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as home:
            path = Path(home) / "convgate.db"

            def refuse(seconds: float) -> None:
                connection = sqlite3.connect(path, isolation_level=None)
                connection.execute("BEGIN EXCLUSIVE")
                time.sleep(seconds)
                connection.execute("ROLLBACK")
                connection.close()

            yield f"sqlite:///{path}", refuse
        return
    import psycopg

    name = f"convgate_soak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')

    def refuse_pg(seconds: float) -> None:
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            time.sleep(seconds)
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    try:
        yield ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}", refuse_pg
    finally:
        drop_database(name)


def make_token(env: dict[str, str], name: str, role: str) -> str:
    return subprocess.check_output([convgate(), "tokens", "create", name, "--role", role], env=env,
                                   text=True).strip()


@contextmanager
def deployment(database_url: str, files: Path, logs: Path, receivers: Receivers):
    env = dict(os.environ, CONVGATE_DATABASE_URL=database_url, CONVGATE_DISPATCHER="none",
               CONVGATE_FILE_ROOTS=json.dumps([str(files)]), CONVGATE_CACHE_DIR=str(logs / "cache"),
               CONVGATE_LEASE_SECONDS="6", CONVGATE_POLL_SECONDS="0.5", CONVGATE_MAX_ATTEMPTS="4",
               CONVGATE_CONCURRENCY="1", CONVGATE_THREADS="1", CONVGATE_METRICS_PUBLIC="false",
               CONVGATE_CALLBACK_HTTP_ORIGINS=json.dumps([receivers.prompt_origin, receivers.tarpit_origin]),
               CONVGATE_ALLOW_PRIVATE_ADDRESSES="true")  # the receivers are on loopback
    subprocess.check_call([convgate(), "db", "upgrade"], env=env, stdout=subprocess.DEVNULL)
    tokens = {f"submitter-{i}": make_token(env, f"submitter-{i}", "submitter") for i in range(3)}
    tokens |= {name: make_token(env, name, role) for name, role in (
        ("auditor", "auditor"), ("operator", "operator"), ("burst", "submitter"),
        *((f"streamer-{i}", "auditor") for i in range(STREAMERS)))}  # auditors: they may stream any verification
    port = free_port()
    api = subprocess.Popen([convgate(), "serve", "--port", str(port), "--no-migrate"], env=env,
                           stdout=(logs / "api.log").open("wb"), stderr=subprocess.STDOUT)
    deployed = Deployment(database_url, env, f"http://127.0.0.1:{port}", tokens, logs)
    try:
        wait_ready(deployed.api_url)
        deployed.start_dispatcher()
        yield deployed
    finally:
        api.terminate()
        api.wait(30)
        if deployed.dispatcher is not None:
            os.killpg(deployed.dispatcher.pid, signal.SIGTERM)
            deployed.dispatcher.wait(30)


async def request(client: httpx.AsyncClient, tally: Tally, who: str, method: str, path: str,
                  **kwargs: object) -> httpx.Response | None:
    try:
        response = await client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        tally.transport_errors[f"{who} {type(exc).__name__}"] += 1
        return None
    tally.saw(who, response)
    return response


async def submitter(client: httpx.AsyncClient, tally: Tally, token: str, files: Path, until: float,
                    real_sha: str | None, callback_url: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    if callback_url is not None:
        (await client.post("/v1/callback-secret", headers=headers)).raise_for_status()
    while time.monotonic() < until:
        body = {"source_uri": (files / "source").as_uri(), "artifact_uri": (files / "model.gguf").as_uri(),
                "artifact_sha256": real_sha if real_sha and random.random() < 0.2 else uuid.uuid4().hex * 2,
                "gates": [1], **({"callback_url": callback_url} if callback_url else {})}
        response = await request(client, tally, "submit", "POST", "/v1/verifications", json=body, headers=headers,
                                 timeout=30)
        if response is not None and response.status_code in (200, 202):
            tally.submitted.append(response.json()["id"])
            if callback_url is not None and "tarpit" not in callback_url:
                tally.prompt_callbacks.append(response.json()["id"])
        await asyncio.sleep(random.uniform(2, 6))


async def watcher(url: str, tally: Tally, token: str, until: float) -> None:
    """Follows a random verification of its own submitter over SSE until it ends (or the run does)."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, read=60)) as client:
        while time.monotonic() < until:
            mine = await client.get("/v1/verifications", params={"limit": 20},
                                    headers={"Authorization": f"Bearer {token}"})
            tally.saw("list", mine)
            items = mine.json().get("items", []) if mine.status_code == 200 else []
            if not items:
                await asyncio.sleep(1)
                continue
            try:
                async with client.stream("GET", f"/v1/verifications/{random.choice(items)['id']}/events",
                                         headers=headers) as stream:
                    tally.saw("events", stream)
                    async for _line in stream.aiter_lines():
                        if time.monotonic() > until:
                            break
            except httpx.HTTPError as exc:
                tally.transport_errors[f"events {type(exc).__name__}"] += 1
            await asyncio.sleep(random.uniform(0.5, 2))


async def auditor(client: httpx.AsyncClient, tally: Tally, token: str, until: float) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < until:
        await request(client, tally, "audit", "GET", "/v1/verifications", headers=headers,
                      params={"verdict": random.choice(["GO", "NO-GO"]), "limit": 50})
        await request(client, tally, "export", "GET", "/v1/verdicts/export", headers=headers,
                      params={"since": "2020-01-01T00:00:00+02:00"})
        await asyncio.sleep(random.uniform(1, 3))


async def bogus_logins(client: httpx.AsyncClient, tally: Tally, until: float) -> None:
    while time.monotonic() < until:
        await request(client, tally, "login", "POST", "/ui/login", data={"token": uuid.uuid4().hex})
        await asyncio.sleep(0.05)


async def prober(client: httpx.AsyncClient, tally: Tally, until: float) -> None:
    while time.monotonic() < until:
        started = time.perf_counter()
        response = await request(client, tally, "healthz", "GET", "/healthz", timeout=30)
        tally.health.append(time.perf_counter() - started if response is not None else 30.0)
        await asyncio.sleep(0.2)


async def faults(deployed: Deployment, refuse, seconds: float, until_start: float, quiet: asyncio.Lock) -> list[str]:
    """Dispatcher killed at 1/3 and 2/3 of the run, the database refusing for 4 s at 1/2, never while a burst
    runs (`quiet`): a burst asserts no 503 from a healthy database, and on a loaded machine a short run's
    burst can last until the refusal's time."""
    done = []
    for at, what in ((1 / 3, "restart"), (1 / 2, "refuse"), (2 / 3, "restart")):
        await asyncio.sleep(max(0.0, until_start + at * seconds - time.monotonic()))
        if what == "restart":
            await asyncio.to_thread(deployed.restart_dispatcher)
        else:
            async with quiet:
                await asyncio.to_thread(refuse, 4.0)
        done.append(f"{what} at {time.monotonic() - until_start:.0f}s")
    return done


async def bursts(deployed: Deployment, tally: Tally, files: Path, seconds: float, start: float,
                 quiet: asyncio.Lock) -> None:
    """The 200-client mix at BURSTS_AT of the run, each while the database is not refusing (`quiet`)."""
    streamers = [deployed.tokens[f"streamer-{i}"] for i in range(STREAMERS)]
    for at in BURSTS_AT:
        await asyncio.sleep(max(0.0, start + at * seconds - time.monotonic()))
        async with quiet:
            tally.bursts.append(await burst(deployed.api_url, deployed.tokens, streamers, files, start))


async def drive(deployed: Deployment, files: Path, seconds: float, refuse, real_sha: str | None,
                receivers: Receivers) -> tuple[Tally, list[str]]:
    tally = Tally()
    start = time.monotonic()
    until = start + seconds
    limits = httpx.Limits(max_connections=64)
    quiet = asyncio.Lock()  # a burst and the database's refusal never overlap
    async with httpx.AsyncClient(base_url=deployed.api_url, timeout=30, limits=limits) as client:
        submitters = [deployed.tokens[f"submitter-{i}"] for i in range(3)]
        callbacks = [f"{receivers.tarpit_origin}/tarpit", f"{receivers.prompt_origin}/hook", None]
        tasks = [*(submitter(client, tally, token, files, until, real_sha, callback)
                   for token, callback in zip(submitters, callbacks, strict=True)),
                 bursts(deployed, tally, files, seconds, start, quiet),
                 *(watcher(deployed.api_url, tally, submitters[i % 3], until) for i in range(6)),
                 auditor(client, tally, deployed.tokens["auditor"], until), bogus_logins(client, tally, until),
                 prober(client, tally, until + 5)]
        fault_task = asyncio.create_task(faults(deployed, refuse, seconds, start, quiet))
        await asyncio.gather(*tasks)
        return tally, await fault_task


def drain(deployed: Deployment, ids: list[str], stall_seconds: float) -> tuple[dict[str, dict], dict[str, str]]:
    """Every submitted verification's final state, polled until all have ended or none has ended for
    `stall_seconds` (a queue still draining at the worker pool's pace is not a stuck one); with the
    states of those that never ended."""
    headers = {"Authorization": f"Bearer {deployed.tokens['auditor']}"}
    final: dict[str, dict] = {}
    last: dict[str, str] = {}
    progressed = time.monotonic()
    with httpx.Client(base_url=deployed.api_url, headers=headers, timeout=30) as client:
        while len(final) < len(ids) and time.monotonic() - progressed < stall_seconds:
            for verification_id in ids:
                if verification_id not in final:
                    row = client.get(f"/v1/verifications/{verification_id}").json()
                    last[verification_id] = row["state"]
                    if row["state"] in TERMINAL:
                        final[verification_id] = row
                        progressed = time.monotonic()
            time.sleep(1)
    return final, {v: state for v, state in last.items() if v not in final}


def verdict_counts(database_url: str, ids: list[str]) -> Counter[str]:
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT verification_id, count(*) FROM verdicts GROUP BY verification_id"))
        counts = Counter({verification_id: n for verification_id, n in rows if verification_id in set(ids)})
    engine.dispose()
    return counts


def files_to_verify(root: Path, source: Path | None, artifact: Path | None) -> str | None:
    """A source directory and an artifact under `root` (the server's file root); the artifact's sha256
    when it is a real GGUF worth a whole gate-1 run, else None (every submission's digest is wrong)."""
    import hashlib
    import shutil

    if source is not None and artifact is not None:
        shutil.copytree(source, root / "source")
        shutil.copyfile(artifact, root / "model.gguf")
        return hashlib.sha256((root / "model.gguf").read_bytes()).hexdigest()
    (root / "source").mkdir()
    (root / "source" / "config.json").write_text("{}")
    (root / "model.gguf").write_bytes(b"GGUF" + os.urandom(1024))
    return None


def check(tally: Tally, final: dict[str, dict], counts: Counter[str], faults_done: list[str],
          receivers: Receivers) -> list[str]:
    problems = []
    p99 = percentile(tally.health, 0.99)
    if not p99 < HEALTH_P99_LIMIT:
        problems.append(f"/healthz p99 {p99:.3f}s (limit {HEALTH_P99_LIMIT}s)")
    if errors := tally.server_errors():
        problems.append(f"undeclared 5xx: {errors}")
    if missing := [v for v in tally.submitted if v not in final]:
        problems.append(f"{len(missing)} verifications stopped moving before they ended, e.g. {missing[:3]}")
    for verification_id, row in final.items():
        verdicts = counts.get(verification_id, 0)
        if row["state"] == "completed" and verdicts != 1:
            problems.append(f"{verification_id} completed with {verdicts} verdicts")
        if row["state"] != "completed" and (verdicts or not row.get("reason")):
            problems.append(f"{verification_id} {row['state']} with {verdicts} verdicts, reason {row.get('reason')!r}")
    if len(faults_done) != 3:
        problems.append(f"faults not all applied: {faults_done}")
    problems += check_bursts(tally.bursts)
    problems += check_callbacks(tally.prompt_callbacks, final, receivers)
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--stall-minutes", type=float, default=3.0,
                        help="after the load: give up when no verification has ended for this long")
    parser.add_argument("--source", type=Path, help="a model directory (with --artifact: real gate-1 runs)")
    parser.add_argument("--artifact", type=Path, help="a GGUF converted from --source")
    args = parser.parse_args()
    with ExitStack() as stack:
        files = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-files-")))
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-logs-")))
        real_sha = files_to_verify(files, args.source, args.artifact)
        database_url, refuse = stack.enter_context(database(args.database))
        receivers = Receivers()
        stack.callback(receivers.close)
        deployed = stack.enter_context(deployment(database_url, files, logs, receivers))
        started = time.monotonic()
        tally, faults_done = asyncio.run(drive(deployed, files, args.minutes * 60, refuse, real_sha, receivers))
        drained = time.monotonic()
        final, unfinished = drain(deployed, tally.submitted, args.stall_minutes * 60)
        wait_for_callbacks(tally.prompt_callbacks, receivers, final, args.stall_minutes * 60)
        counts = verdict_counts(database_url, tally.submitted)
        problems = check(tally, final, counts, faults_done, receivers)
        outcomes = Counter(f"{row['state']} {row.get('verdict') or ''}".strip() for row in final.values())
        print(json.dumps({
            "database": args.database, "minutes": args.minutes, "wall_seconds": round(time.monotonic() - started),
            "faults": faults_done, "dispatcher_restarts": deployed.restarts,
            "healthz": {"probes": len(tally.health), "p50": round(percentile(tally.health, 0.5), 4),
                        "p99": round(percentile(tally.health, 0.99), 4), "max": round(max(tally.health), 4)},
            "responses": {f"{who} {code}": n for (who, code), n in sorted(tally.statuses.items())},
            "transport_errors": dict(tally.transport_errors),
            "verifications": {"submitted": len(tally.submitted), "ended": len(final), "outcomes": dict(outcomes),
                              "drain_seconds": round(time.monotonic() - drained),
                              "unfinished": dict(Counter(unfinished.values()))},
            **summary(tally.bursts, receivers), "problems": problems}, indent=1))
        if problems:
            for name in sorted(os.listdir(logs)):
                if name.endswith(".log"):
                    print(f"--- {name}, last lines:\n" + (logs / name).read_text(errors="replace")[-3000:],
                          file=sys.stderr)
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
