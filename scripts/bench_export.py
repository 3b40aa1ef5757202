#!/usr/bin/env python3
"""Verdict export benchmark on real Postgres: the server's memory while it streams GET /v1/verdicts/export.

Seeds `--verdicts` completed verifications with verdicts (one SQL statement), then streams two exports
through `convgate serve` (one uvicorn process, API-only: CONVGATE_DISPATCHER=none) and reads the server
process's peak resident memory (VmHWM in /proc/<pid>/status, reset before each export through
/proc/<pid>/clear_refs) for: the idle server (baseline), an export of the newest `--small` rows (a
`since` filter) and the export of all rows. Constant memory means the large export peaks where the
small one does. Also rows/s and bytes. The throwaway database is dropped at the end.
Usage: python scripts/bench_export.py [--verdicts 1000000] [--small 10000] [--formats jsonl,csv] | --smoke
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
from throwaway_server import served

SEED = """
    WITH seeded AS (
        INSERT INTO verifications (id, submitted_by, idempotency_key, request_sha256, source_uri, artifact_uri,
            artifact_sha256, request, policy, policy_sha256, policy_origin, state, attempt, max_attempts,
            verdict_result, created_at, updated_at, started_at, finished_at)
        SELECT lpad(to_hex(g), 32, '0')::uuid::text, 'pipeline-' || (g %% 5), 'seed-' || g,
            md5(g::text) || md5(g::text), 'hf://org/src-' || (g / 100) || '@x', 'hf://org/m@x/m-' || g || '.gguf',
            encode(sha256(('a' || (g / 10))::bytea), 'hex'), '{}'::json, '{"version": "2026.11-2"}'::json,
            md5('p') || md5('p'), 'configured:default', 'completed', 1, 3,
            CASE WHEN g %% 7 = 0 THEN 'NO-GO' ELSE 'GO' END, %(now)s - make_interval(secs => g),
            %(now)s, %(now)s - make_interval(secs => g), %(now)s
        FROM generate_series(1, %(count)s) AS g
        RETURNING id, verdict_result)
    INSERT INTO verdicts (verification_id, attempt, verdict, blocker_codes, report, created_at)
    SELECT id, 1, verdict_result,
        CASE WHEN verdict_result = 'GO' THEN '[]'::json ELSE '["tensor.value_mismatch"]'::json END,
        '{"verdict": "seeded"}'::json, %(now)s FROM seeded"""


def seed(dsn: str, count: int, moment: datetime) -> None:
    """`count` verdicts, one a second back from `moment` (row g is g seconds old): the newest k rows are
    exactly those since `moment - k seconds - 0.5 s`."""
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute(SEED, {"count": count, "now": moment})
        db.execute("ANALYZE verifications")
        db.execute("ANALYZE verdicts")


def memory_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> bool:
    """Linux resets VmHWM to the current RSS on writing 5 to clear_refs (a process we own)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def export(url: str, token: str, params: dict[str, str]) -> tuple[int, int, float]:
    """(rows, bytes, seconds) of one streamed export; the body is counted as it arrives, never kept."""
    rows = size = 0
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{url}/v1/verdicts/export", params=params, headers=headers, timeout=600) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            rows += chunk.count(b"\n")
            size += len(chunk)
    return rows, size, time.perf_counter() - started


def measured(pid: int, url: str, token: str, params: dict[str, str], expected: int) -> tuple[int, float, int]:
    """(peak KiB during the export, rows/s, bytes)."""
    reset_peak(pid)
    rows, size, seconds = export(url, token, params)
    header = 1 if params.get("format") == "csv" else 0
    if rows - header != expected:
        raise RuntimeError(f"exported {rows - header} rows, expected {expected}")
    return memory_kib(pid, "VmHWM"), expected / seconds, size


def bench(pid: int, url: str, token: str, args: argparse.Namespace, moment: datetime) -> None:
    since = (moment - timedelta(seconds=args.small, milliseconds=500)).isoformat()
    export(url, token, {"since": (moment - timedelta(seconds=5)).isoformat()})  # warm up: imports, statements
    time.sleep(0.5)
    reset_peak(pid)
    idle = memory_kib(pid, "VmRSS")
    print(f"server RSS before the exports: {idle / 1024:.1f} MiB (pid {pid}, VmHWM reset per export: "
          f"{reset_peak(pid)})")
    print(f"{'format':<8}{'rows':>11}{'rows/s':>11}{'MB out':>9}{'peak MiB':>10}{'vs idle':>9}")
    for fmt in args.formats.split(","):
        small = measured(pid, url, token, {"format": fmt, "since": since}, args.small)
        large = measured(pid, url, token, {"format": fmt}, args.verdicts)
        for rows, (peak, rate, size) in ((args.small, small), (args.verdicts, large)):
            print(f"{fmt:<8}{rows:>11,}{rate:>11,.0f}{size / 1e6:>9.1f}{peak / 1024:>10.1f}"
                  f"{(peak - idle) / 1024:>+8.1f}M")
        print(f"{fmt}: peak large / peak small = {large[0] / small[0]:.2f}x ({args.verdicts:,} vs {args.small:,} "
              f"rows; idle {idle / 1024:.1f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verdicts", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--formats", default="jsonl,csv")
    parser.add_argument("--smoke", action="store_true", help="the smallest input: 2,000 and 200 rows, JSON Lines")
    args = parser.parse_args()
    if args.smoke:
        args.verdicts, args.small, args.formats = 2000, 200, "jsonl"
    with served("auditor") as server:
        moment = datetime.now(UTC).replace(microsecond=0)
        started = time.perf_counter()
        seed(server.dsn, args.verdicts, moment)
        print(f"seeded {args.verdicts:,} verdicts in {time.perf_counter() - started:.1f}s")
        bench(server.pid, server.url, server.token, args, moment)


if __name__ == "__main__":
    main()
