#!/usr/bin/env python3
"""Service benchmark on real Postgres: convgate against its floor, driven by a compiled load generator.

`wrk` (C, one thread, epoll; Debian's package) drives each endpoint for a fixed time at a fixed number of
connections, so the client is never what bounds the figures (the earlier Python client was: it, not the
server, set the ratio). Each endpoint is measured on `convgate serve` and on scripts/api_floor.py (a bare
ASGI app that only writes and reads the same rows, durably) in the same run, on the same database:

1. GET /healthz: the framework's floor, no database.
2. POST /v1/verifications: a unique Idempotency-Key per request (wrk's Lua), the same body.
3. The auditor query GET /v1/verifications?artifact_sha256=... over --verdicts stored verdicts (a random
   digest per request), its access-log row committed before the answer, as the floor's is.

Both servers run side by side and are measured in turn, in rounds (the machine's other jobs come and go).
Printed per endpoint: requests/s, p50 and p99 latency, errors, the server's CPU per request (its processes
together); then convgate / floor for each, per round. Usage: python scripts/bench_api.py [--seconds 10]
[--rounds 3] [--connections 16] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from throwaway_server import free_port, served, wait_ready

REPORT = """
done = function(summary, latency, requests)
  io.write(string.format('{"requests": %d, "seconds": %.6f, "p50_us": %d, "p99_us": %d, "status_errors": %d, '
    .. '"socket_errors": %d}\\n', summary.requests, summary.duration / 1e6, latency:percentile(50),
    latency:percentile(99), summary.errors.status, summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout))
end
"""
SUBMIT = """
local counter = 0
request = function()
  counter = counter + 1
  return wrk.format("POST", "/v1/verifications", {["Content-Type"] = "application/json",
    ["Authorization"] = AUTHORIZATION, ["Idempotency-Key"] = RUN .. "-" .. counter}, BODY)
end
"""
AUDIT = """
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/v1/verifications?limit=50&artifact_sha256=" .. SHAS[(n * 7919) % #SHAS + 1],
    {["Authorization"] = AUTHORIZATION})
end
"""


@dataclass(frozen=True)
class Load:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    server_cpu_ms: float  # the server process's CPU per request

    @property
    def rate(self) -> float:
        return self.requests / self.seconds


def lua_string(value: str) -> str:
    return json.dumps(value)  # a JSON string literal is a valid Lua string literal for these ASCII values


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` and its children so far (Linux /proc): with --workers, the API's
    processes are the server's children."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    used = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return used + sum(cpu_seconds(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listed:
            return [int(child) for child in listed.read().split()]
    except OSError:
        return []


def wrk(pid: int, url: str, path: str, script: str, seconds: float, connections: int) -> Load:
    """One wrk run against `url + path`: what it measured, and the server's CPU per request meanwhile."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write(script + REPORT)
    try:
        before = cpu_seconds(pid)
        command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "30s", "-s",
                   handle.name, url + path]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        used = cpu_seconds(pid) - before
    finally:
        os.unlink(handle.name)
    found = json.loads(out.strip().splitlines()[-1])
    return Load(found["requests"], found["seconds"], found["p50_us"] / 1e3, found["p99_us"] / 1e3,
                found["status_errors"] + found["socket_errors"], used * 1e3 / max(found["requests"], 1))


def seed_verdicts(dsn: str, count: int) -> list[str]:
    """`count` completed verifications with verdicts, ten per artifact digest, in one SQL statement (a
    million in about a minute on 2 cores): ids ascend, so the primary key is appended to, not scattered."""
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("""
            WITH seeded AS (
                INSERT INTO verifications (id, submitted_by, idempotency_key, request_sha256, source_uri,
                    artifact_uri, artifact_sha256, request, policy, policy_sha256, policy_origin, state, attempt,
                    max_attempts, verdict_result, created_at, updated_at, finished_at)
                SELECT lpad(to_hex(g), 32, '0')::uuid::text, 'seed', 'seed-' || g, md5(g::text) || md5(g::text),
                    'hf://org/src@x', 'hf://org/m@x/m.gguf', encode(sha256(('a' || (g / 10))::bytea), 'hex'),
                    '{}'::json, '{}'::json, md5('p') || md5('p'), 'configured:default', 'completed', 1, 3,
                    CASE WHEN g %% 7 = 0 THEN 'NO-GO' ELSE 'GO' END, now() - (g || ' seconds')::interval, now(),
                    now()
                FROM generate_series(1, %s) AS g
                RETURNING id, verdict_result)
            INSERT INTO verdicts (verification_id, attempt, verdict, blocker_codes, report, created_at)
            SELECT id, 1, verdict_result, '[]'::json, '{"verdict": "GO"}'::json, now() FROM seeded""", (count,))
        db.execute("ANALYZE verifications")
        db.execute("ANALYZE verdicts")
        return [row[0] for row in db.execute("SELECT DISTINCT artifact_sha256 FROM verifications LIMIT 2000")]


@contextmanager
def floor_server(dsn: str) -> Iterator[tuple[int, str]]:
    """scripts/api_floor.py under the same uvicorn settings as `convgate serve`, on the same database."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "api_floor:app", "--app-dir", os.path.dirname(__file__), "--port",
         str(port), "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--log-level", "warning"],
        env=dict(os.environ, CONVGATE_FLOOR_DSN=dsn))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, "/healthz")  # the floor has no /readyz
        yield process.pid, url
    finally:
        process.terminate()
        process.wait(timeout=30)


def scripts(authorization: str, run: str, shas: list[str]) -> dict[str, tuple[str, str]]:
    """(path, Lua) per endpoint; every string the Lua needs is a global set before its functions."""
    body = json.dumps({"source_uri": "hf://org/src@" + "0" * 40,
                       "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf", "artifact_sha256": "e" * 64})
    common = f"AUTHORIZATION = {lua_string(authorization)}\nRUN = {lua_string(run)}\nBODY = {lua_string(body)}\n"
    table = "SHAS = {" + ",".join(lua_string(sha) for sha in shas) + "}\n"
    return {"GET /healthz": ("/healthz", common),
            "POST /v1/verifications": ("/v1/verifications", common + SUBMIT),
            "auditor query": ("/v1/verifications", common + table + AUDIT)}


@dataclass(frozen=True)
class Side:
    """One server under test: its process (the CPU is counted there and in its children), URL and token."""

    pid: int
    url: str
    authorization: str
    run: str


def measure(sides: dict[str, Side], shas: list[str], seconds: float, connections: int,
            rounds: int) -> dict[str, dict[str, list[Load]]]:
    """Per endpoint, each side warmed up with its own load first (its connections opened, its statements
    compiled and prepared: the floor opens its connections at start-up), then `rounds` rounds in which each
    side is measured in turn. On a machine shared with other jobs the load changes by the minute: a ratio of
    two runs minutes apart measured the neighbours as much as the servers, one of two runs seconds apart
    much less."""
    chosen = {name: scripts(side.authorization, side.run, shas) for name, side in sides.items()}
    loads: dict[str, dict[str, list[Load]]] = {}
    for label in chosen[next(iter(sides))]:
        loads[label] = {name: [] for name in sides}
        for name, side in sides.items():
            path, lua = chosen[name][label]
            wrk(side.pid, side.url, path, lua.replace(f"RUN = {lua_string(side.run)}",
                                                      f"RUN = {lua_string(side.run + 'w')}"),
                min(seconds, 3), connections)
        for round_number in range(rounds):
            for name, side in sides.items():
                path, lua = chosen[name][label]
                tag = f"{side.run}{round_number}"
                tagged = lua.replace(f"RUN = {lua_string(side.run)}", f"RUN = {lua_string(tag)}")
                loads[label][name].append(wrk(side.pid, side.url, path, tagged, seconds, connections))
    return loads


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def report(loads: dict[str, dict[str, list[Load]]], connections: int, seconds: float, verdicts: int,
           workers: int, rounds: int) -> None:
    print(f"API benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; wrk, 1 thread, {connections} connections, {rounds} rounds of {seconds:g} s per "
          f"endpoint and server, taken in turn; Postgres; auditor query over {verdicts:,} verdicts; convgate with "
          f"{workers} API process(es)")
    print(f"{'endpoint':<26}{'server':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'CPU ms/req':>12}"
          "   (the median of the rounds; errors summed)")
    for label, sides in loads.items():
        for name, runs in sides.items():
            print(f"{label:<26}{name:>9}{median([r.rate for r in runs]):>9.0f}{median([r.p50_ms for r in runs]):>9.1f}"
                  f"{median([r.p99_ms for r in runs]):>9.1f}{sum(r.errors for r in runs):>8}"
                  f"{median([r.server_cpu_ms for r in runs]):>12.2f}")
    print("\nconvgate / floor (the median of the rounds' ratios):")
    for label, sides in loads.items():
        pairs = list(zip(sides["convgate"], sides["floor"], strict=True))
        rates = [ours.rate / theirs.rate for ours, theirs in pairs]
        p99s = [ours.p99_ms / theirs.p99_ms for ours, theirs in pairs]
        cpus = [ours.server_cpu_ms / theirs.server_cpu_ms for ours, theirs in pairs]
        print(f"  {label:<24} throughput {median(rates):.2f}x, p99 {median(p99s):.2f}x, server CPU per request "
              f"{median(cpus):.2f}x (rounds: throughput {' '.join(f'{r:.2f}' for r in rates)}; "
              f"p99 {' '.join(f'{r:.2f}' for r in p99s)})")
    print("(targets: submissions at 0.5x the floor's throughput or better; the auditor query's p99 at 2x the "
          "floor's or better. The floor, scripts/api_floor.py, writes and reads the same rows durably and does "
          "nothing else: no implementation that keeps them durable can beat it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--verdicts", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=1, help="convgate's API processes (convgate serve --workers)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("bench_api.py needs wrk (Debian: apt-get install wrk; dev.py test installs it)")
    run = uuid.uuid4().hex[:8]  # Idempotency-Keys unique to this run (wrk is one thread: a counter does the rest)
    with served("admin", *(("--workers", str(args.workers)) if args.workers != 1 else ())) as server:
        started = time.perf_counter()
        shas = seed_verdicts(server.dsn, args.verdicts)
        print(f"seeded {args.verdicts:,} verdicts in {time.perf_counter() - started:.1f} s", flush=True)
        with floor_server(server.dsn) as (floor_pid, floor_url):
            sides = {"convgate": Side(server.pid, server.url, f"Bearer {server.token}", f"c{run}"),
                     "floor": Side(floor_pid, floor_url, "", f"f{run}")}
            loads = measure(sides, shas, args.seconds, args.connections, args.rounds)
    report(loads, args.connections, args.seconds, args.verdicts, args.workers, args.rounds)


if __name__ == "__main__":
    main()
