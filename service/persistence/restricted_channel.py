"""The Kubernetes worker's `AttemptChannel`: a login with no table privileges calling the SECURITY
DEFINER functions of migration 0006 with its attempt's secret (see `worker_channel.py` for why
they only file reports that the control plane applies).

Because a report takes effect on the control plane's next dispatch tick, `start` waits until the
start was accepted (or refused), and `record_verdict` / `end_without_verdict` wait until their
report was applied, so the worker exits only once its outcome is stored (or known to be stale);
the dispatch loop applies reports before it reaps exited workers, so an exit is never mistaken for
a crash."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

from service.persistence.attempt_contract import StartedAttempt
from service.persistence.db import make_engine


class RestrictedChannel:
    def __init__(self, database_url: str | Engine, verification_id: str, attempt: int, worker: str, secret: str,
                 *, wait_seconds: float = 300.0, poll_seconds: float = 0.5) -> None:
        self._owns_engine = isinstance(database_url, str)
        self.engine = make_engine(database_url) if isinstance(database_url, str) else database_url
        self.verification_id, self.attempt, self.worker, self._secret = verification_id, attempt, worker, secret
        self.wait_seconds, self.poll_seconds = wait_seconds, poll_seconds

    def _call(self, function: str, *extra: tuple[str, Any]) -> Any:
        """`SELECT function(id, attempt, secret, worker, extra...)`, parameters bound (never in the SQL text)."""
        params: dict[str, Any] = {"id": self.verification_id, "attempt": self.attempt, "secret": self._secret,
                                  "worker": self.worker}
        names = ["id", "attempt", "secret", "worker"]
        for name, value in extra:
            params[name] = value
            names.append(name)
        arguments = ", ".join(f"CAST(:{n} AS jsonb)" if n in ("progress", "report") else f":{n}" for n in names)
        with self.engine.begin() as connection:
            return connection.execute(text(f"SELECT {function}({arguments})"), params).scalar()

    def _wait(self, poll: Callable[[], Any], done: Callable[[Any], bool]) -> Any:
        deadline = time.monotonic() + self.wait_seconds
        while True:
            answer = poll()
            if done(answer) or time.monotonic() >= deadline:
                return answer
            time.sleep(self.poll_seconds)

    def _outcome(self, kind: str) -> str | None:
        return self._call("convgate_worker_outcome", ("kind", kind))

    def start(self) -> StartedAttempt | None:
        answer = self._wait(lambda: self._call("convgate_worker_start"),
                            lambda a: a is None or a.get("start") in ("accepted", "refused", "invalid"))
        if answer is None or answer.get("start") != "accepted":
            return None
        return StartedAttempt(request=answer["request"], policy=answer["policy"])

    def heartbeat(self, progress: dict[str, Any] | None) -> bool:
        return bool(self._call("convgate_worker_heartbeat", ("progress", json.dumps(progress))))

    def record_verdict(self, report: dict[str, Any]) -> bool:
        if not self._call("convgate_worker_record_verdict", ("report", json.dumps(report))):
            return False
        return self._wait(lambda: self._outcome("verdict"), lambda o: o not in ("pending",)) == "accepted"

    def record_shard(self, shard: int, shards: int, payload: dict[str, Any]) -> bool:
        """Files the part as report `shard-<k>` (revision 0007) and waits until the control plane stored it."""
        body = {**payload, "shards": shards}
        if not self._call("convgate_worker_record_shard", ("shard", shard), ("report", json.dumps(body))):
            return False
        return self._wait(lambda: self._outcome(f"shard-{shard}"), lambda o: o not in ("pending",)) == "accepted"

    def end_without_verdict(self, reason: str, *, give_up: bool = False) -> None:
        if self._call("convgate_worker_end", ("reason", reason), ("give_up", give_up)):
            self._wait(lambda: self._outcome("end"), lambda o: o not in ("pending",))

    def close(self) -> None:
        if self._owns_engine:
            self.engine.dispose()
