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

Printed per endpoint: requests/s, p50 and p99 latency, errors, the server process's CPU per request; then
convgate / floor for each. Usage: python scripts/bench_api.py [--seconds 15] [--connections 16]
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
    """User + system CPU of process `pid` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def measure(pid: int, url: str, authorization: str, run: str, shas: list[str], seconds: float,
            connections: int) -> dict[str, Load]:
    """Each endpoint warmed up with its own load first (its connections opened, its statements compiled and
    prepared: the floor opens its connections at start-up), then measured."""
    chosen = scripts(authorization, run, shas)
    loads = {}
    for label, (path, lua) in chosen.items():
        wrk(pid, url, path, lua.replace(f'RUN = {lua_string(run)}', f'RUN = {lua_string(run + "w")}'),
            min(seconds, 3), connections)
        loads[label] = wrk(pid, url, path, lua, seconds, connections)
    return loads


def report(convgate: dict[str, Load], floor: dict[str, Load], connections: int, seconds: float,
           verdicts: int) -> None:
    print(f"API benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}; wrk, 1 thread, {connections} connections, {seconds:g} s per endpoint; "
          f"Postgres; auditor query over {verdicts:,} verdicts")
    print(f"{'endpoint':<26}{'server':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'CPU ms/req':>12}")
    for label in convgate:
        for name, loads in (("convgate", convgate), ("floor", floor)):
            load = loads[label]
            print(f"{label:<26}{name:>9}{load.rate:>9.0f}{load.p50_ms:>9.1f}{load.p99_ms:>9.1f}{load.errors:>8}"
                  f"{load.server_cpu_ms:>12.2f}")
    print("\nconvgate / floor:")
    for label, ours in convgate.items():
        theirs = floor[label]
        print(f"  {label:<24} throughput {ours.rate / theirs.rate:.2f}x, p99 {ours.p99_ms / theirs.p99_ms:.2f}x, "
              f"server CPU per request {ours.server_cpu_ms / theirs.server_cpu_ms:.2f}x")
    print("(targets: submissions at 0.5x the floor's throughput or better with p99 at 2x or better; the auditor "
          "query's p99 at 1.5x the floor's or better. The floor, scripts/api_floor.py, writes and reads the same "
          "rows durably and does nothing else: no implementation that keeps them durable can beat it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--verdicts", type=int, default=1_000_000)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("bench_api.py needs wrk (Debian: apt-get install wrk; dev.py test installs it)")
    run = uuid.uuid4().hex[:8]  # Idempotency-Keys unique to this run (wrk is one thread: a counter does the rest)
    with served("admin") as server:
        started = time.perf_counter()
        shas = seed_verdicts(server.dsn, args.verdicts)
        print(f"seeded {args.verdicts:,} verdicts in {time.perf_counter() - started:.1f} s", flush=True)
        convgate = measure(server.pid, server.url, f"Bearer {server.token}", f"c{run}", shas, args.seconds,
                           args.connections)
        with floor_server(server.dsn) as (floor_pid, floor_url):
            floor = measure(floor_pid, floor_url, "", f"f{run}", shas, args.seconds, args.connections)
    report(convgate, floor, args.connections, args.seconds, args.verdicts)


if __name__ == "__main__":
    main()
