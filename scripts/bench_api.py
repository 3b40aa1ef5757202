#!/usr/bin/env python3
"""Service benchmark on real Postgres, each figure next to a baseline measured in the same run.

1. Submit throughput and latency: concurrent POST /v1/verifications (unique Idempotency-Keys) vs
   the same load on GET /healthz (plain HTTP, no database) against the same server process.
   Also the server process's own CPU per request (from /proc), which other load on the machine
   disturbs far less than the latencies do.
2. Auditor query: p50/p99 of GET /v1/verifications?artifact_sha256=... over 1,000,000 stored verdicts,
   vs sequential GET /healthz.

The server is `convgate serve` (one uvicorn process, API-only replica: CONVGATE_DISPATCHER=none) on a
throwaway database that is dropped at the end. Usage: python scripts/bench_api.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psycopg
from throwaway_server import free_port, served, wait_ready


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def load(url: str, requests: int, concurrency: int, make) -> tuple[float, list[float], int]:
    """(wall seconds, latencies, errors) for `requests` calls made by `concurrency` workers."""
    latencies: list[float] = []
    errors = 0
    counter = iter(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def worker() -> None:
            nonlocal errors
            for i in counter:
                started = time.perf_counter()
                response = await make(client, i)
                latencies.append(time.perf_counter() - started)
                errors += response.status_code >= 400
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies, errors


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
        shas = [row[0] for row in db.execute("SELECT DISTINCT artifact_sha256 FROM verifications LIMIT 2000")]
    return shas


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process `pid` so far (Linux /proc; NaN elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(pid: int, url: str, requests: int, concurrency: int,
             make) -> tuple[float, list[float], int, tuple[float, float]]:
    """`load`, plus the CPU milliseconds per request of the server and of this load generator."""
    server, client = cpu_seconds(pid), time.process_time()
    wall, latencies, errors = asyncio.run(load(url, requests, concurrency, make))
    used = ((cpu_seconds(pid) - server) * 1e3 / requests, (time.process_time() - client) * 1e3 / requests)
    return wall, latencies, errors, used


def row(label: str, requests: int, wall: float, latencies: list[float], errors: int,
        cpu_ms: tuple[float, float]) -> str:
    return (f"{label:<26}{requests / wall:>9.0f}{percentile(latencies, .5) * 1e3:>9.1f}"
            f"{percentile(latencies, .99) * 1e3:>9.1f}{errors:>8}{cpu_ms[0]:>12.2f}{cpu_ms[1]:>12.2f}")


def submit_rows(pid: int, url: str, headers: dict[str, str], requests: int,
                concurrency: int) -> tuple[tuple, tuple]:
    """(/healthz, POST /v1/verifications) of one server: each `measured` tuple."""
    body = {"source_uri": "hf://org/src@" + "0" * 40, "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf",
            "artifact_sha256": "e" * 64}

    async def health(client, i):
        return await client.get("/healthz")

    payload = json.dumps(body).encode()  # encoded once: the load generator shares the server's 2 cores
    post_headers = headers | {"Content-Type": "application/json"}

    async def post(client, i):
        return await client.post("/v1/verifications", content=payload,
                                 headers=post_headers | {"Idempotency-Key": f"k{i}"})

    asyncio.run(load(url, 200, concurrency, health))  # warm up
    return measured(pid, url, requests, concurrency, health), measured(pid, url, requests, concurrency, post)


def ratios(base: tuple, sub: tuple) -> str:
    return (f"throughput {base[0] / sub[0]:.2f}x, p99 {percentile(sub[1], .99) / percentile(base[1], .99):.1f}x, "
            f"server CPU per request {sub[3][0] / base[3][0] if base[3][0] else float('nan'):.1f}x")


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


def bench_submit(server, requests: int, concurrency: int) -> None:
    base, sub = submit_rows(server.pid, server.url, server.headers, requests, concurrency)
    with floor_server(server.dsn) as (floor_pid, floor_url):
        floor_base, floor_sub = submit_rows(floor_pid, floor_url, {}, requests, concurrency)
    print(f"submit load: {requests} requests, {concurrency} concurrent, one uvicorn process, Postgres; machine load "
          f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other work distorts the latencies)")
    print(f"{'endpoint':<26}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'server CPU':>12}"
          f"{'client CPU':>12}")
    print(row("GET /healthz (baseline)", requests, *base))
    print(row("POST /v1/verifications", requests, *sub))
    print(row("floor GET /healthz", requests, *floor_base))
    print(row("floor POST (one insert)", requests, *floor_sub))
    print(f"ratio submit/baseline: {ratios(base, sub)} (CPU columns: ms per request; the client is this process)")
    print(f"ratio floor submit/floor healthz: {ratios(floor_base, floor_sub)} (scripts/api_floor.py: a bare ASGI app "
          "that only writes the same rows, durably; no endpoint that commits before answering can beat it)")


def audit_latencies(url: str, headers: dict[str, str], shas: list[str], queries: int) -> tuple[list, list]:
    """(query latencies, /healthz latencies), alternating, sequential."""
    rng = random.Random(0)
    query_lat, health_lat = [], []
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for sha in shas[:10]:  # warm up, as /healthz was by the submit load: compiled and prepared statements
            client.get("/v1/verifications", params={"artifact_sha256": sha, "limit": 50})
        for _ in range(queries):
            t0 = time.perf_counter()
            response = client.get("/v1/verifications", params={"artifact_sha256": rng.choice(shas), "limit": 50})
            query_lat.append(time.perf_counter() - t0)
            assert response.status_code == 200 and len(response.json()["items"]) >= 1
            t0 = time.perf_counter()
            client.get("/healthz")
            health_lat.append(time.perf_counter() - t0)
    return query_lat, health_lat


def bench_audit(server, verdicts: int, queries: int) -> None:
    started = time.perf_counter()
    shas = seed_verdicts(server.dsn, verdicts)
    print(f"\nseeded {verdicts:,} verdicts in {time.perf_counter() - started:.1f}s")
    print(f"auditor query by artifact sha256 over {verdicts:,} verdicts, {queries} sequential queries:")
    with floor_server(server.dsn) as (_, floor_url):
        for label, url, headers in (("convgate", server.url, server.headers), ("floor", floor_url, {})):
            query_lat, health_lat = audit_latencies(url, headers, shas, queries)
            q99, h99 = percentile(query_lat, .99), percentile(health_lat, .99)
            print(f"  {label:<9}query   p50 {statistics.median(query_lat) * 1e3:.1f} ms  p99 {q99 * 1e3:.1f} ms")
            print(f"  {label:<9}healthz p50 {statistics.median(health_lat) * 1e3:.1f} ms  p99 {h99 * 1e3:.1f} ms"
                  f"  -> query p99 / baseline p99 = {q99 / h99:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--verdicts", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=500)
    args = parser.parse_args()
    with served("admin") as server:
        bench_submit(server, args.requests, args.concurrency)
        bench_audit(server, args.verdicts, args.queries)


if __name__ == "__main__":
    main()
