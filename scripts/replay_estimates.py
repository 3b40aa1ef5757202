#!/usr/bin/env python3
"""How far off are the queue's start estimates? Replay the estimator (service/queue_replay.py) over
finished runs and print the median and p90 absolute error, with the artifact's size and without it.

    python scripts/replay_estimates.py --database-url postgresql+psycopg://...   # a deployment's history
    python scripts/replay_estimates.py --generate 36                              # make a history first

`--generate N` runs a real service on a throwaway SQLite database (the local pool, `--concurrency`
workers, the real Job entrypoint) and submits N gate-1 verifications of conversions the fixtures hold
(tiny-llama, MiniLM and SmolLM2-135M at Q4_K_M, Q8_0 and F16: 13 to 271 MB), in bursts of random size,
each burst submitted while the previous one still runs, so that most runs wait behind others. The sizes are
given with each submission (`artifact_size`), as a pipeline would. Then it replays that history.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

from service.persistence.db import make_engine, session_factory  # noqa: E402
from service.persistence.queue_history import history  # noqa: E402
from service.queue_replay import Past, ReplayError, error_of, replay  # noqa: E402

# (fixture folder, artifact): three models of different sizes, two or three types each, so that what a run
# costs depends on the model's size and not only on its type
ARTIFACTS = (("tiny-llama", "tiny-llama-Q8_0.gguf"), ("tiny-llama", "tiny-llama-Q4_K_M.gguf"),
             ("minilm", "minilm-Q8_0.gguf"), ("minilm", "minilm-Q4_K_M.gguf"),
             ("smollm2", "smollm2-Q4_K_M.gguf"), ("smollm2", "smollm2-Q8_0.gguf"), ("smollm2", "smollm2-F16.gguf"))


def errors(url: str, pool: int | None) -> dict[str, ReplayError]:
    engine = make_engine(url)
    with session_factory(engine)() as session:
        past = history(session, limit=1000)
    engine.dispose()
    unsized = [Past(id=p.id, created=p.created, started=p.started, finished=p.finished, completed=p.completed)
               for p in past]
    return {"with the artifact's size": error_of(replay(past, pool, last=1000)),
            "median run only": error_of(replay(unsized, pool, last=1000))}


def generate(count: int, concurrency: int, seed: int) -> str:
    """A real service's history of `count` gate-1 runs; returns its database URL."""
    from engine.digests import sha256_file
    from service.config import Settings
    from service.dispatch.loop import DispatchLoop
    from service.persistence.db import transaction
    from service.persistence.migrate import upgrade
    from service.schemas import SubmitRequest
    from service.verifications import admit, submit

    fixtures = ROOT / ".fixtures"
    workdir = Path(tempfile.mkdtemp(prefix="convgate-replay-"))
    url = f"sqlite:///{workdir / 'replay.db'}"
    upgrade(url)
    settings = Settings(database_url=url, cache_dir=workdir / "cache", concurrency=concurrency, poll_seconds=0.2,
                        file_roots=(fixtures.resolve(),))
    engine = make_engine(url)
    factory = session_factory(engine)
    digests = {name: sha256_file(fixtures / folder / name) for folder, name in ARTIFACTS}
    loop = DispatchLoop.for_settings(settings, factory)
    loop.start()
    rng = random.Random(seed)
    submitted = 0
    try:
        while submitted < count:
            burst = min(count - submitted, rng.randint(1, 4))
            for _ in range(burst):
                folder, name = rng.choice(ARTIFACTS)
                artifact = (fixtures / folder / name).resolve()
                request = SubmitRequest(source_uri=(fixtures / folder / "source").resolve().as_uri(),
                                        artifact_uri=artifact.as_uri(), artifact_sha256=digests[name], gates=[1],
                                        artifact_size=artifact.stat().st_size)
                with transaction(factory) as session:
                    submit(session, settings, "replay", admit(settings, request), f"replay-{submitted}")
                submitted += 1
            _wait_until_at_most(factory, waiting=1)  # the next burst arrives while this one still runs
        _wait_until_at_most(factory, waiting=0, running=0)
    finally:
        loop.stop()
        engine.dispose()
    return url


def _wait_until_at_most(factory: sessionmaker[Session], *, waiting: int, running: int | None = None) -> None:
    from service.lifecycle import State
    from service.persistence import stats

    while True:
        with factory() as session:
            counts = stats.state_counts(session)
        queued = counts.get(State.QUEUED, 0) + counts.get(State.DISPATCHED, 0)
        if queued <= waiting and (running is None or counts.get(State.RUNNING, 0) <= running):
            return
        time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--database-url", help="replay this database's finished runs")
    source.add_argument("--generate", type=int, metavar="N", help="run N verifications first, then replay them")
    ap.add_argument("--concurrency", type=int, default=1, help="--generate: the local pool's workers")
    ap.add_argument("--pool", type=int, default=None, help="--database-url: the local pool's workers (none: Kueue)")
    ap.add_argument("--seed", type=int, default=36)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.monotonic()
    url = args.database_url or generate(args.generate, args.concurrency, args.seed)
    pool = args.concurrency if args.generate else args.pool
    results = errors(url, pool)
    if args.json:
        print(json.dumps({name: dataclasses.asdict(error) for name, error in results.items()}, indent=2))
        return 0
    print(f"replayed {url} in {time.monotonic() - t0:.0f}s")
    print("| estimate | runs replayed | median absolute error | p90 absolute error |")
    print("|---|---|---|---|")
    for name, error in results.items():
        median = "-" if error.median_abs_seconds is None else f"{error.median_abs_seconds:.1f} s"
        p90 = "-" if error.p90_abs_seconds is None else f"{error.p90_abs_seconds:.1f} s"
        print(f"| {name} | {error.runs} | {median} | {p90} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
