"""What a worker and the database agree on about one attempt: the `AttemptChannel` protocol, what a
started attempt hands the worker, and the variable that carries a Kubernetes worker's attempt
secret. Both channels (`worker_channel.py`, `restricted_channel.py`) and the dispatchers that start
workers import it, so none of them imports another's implementation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

ATTEMPT_SECRET_ENV = "CONVGATE_ATTEMPT_SECRET"


@dataclass(frozen=True, slots=True)
class StartedAttempt:
    """What a worker needs to run: its own request and the policy fixed at submission."""

    request: dict[str, Any]
    policy: dict[str, Any]


class AttemptChannel(Protocol):
    """One attempt of one verification, as its worker sees it. Every method is fenced by that attempt:
    a superseded, cancelled or finished attempt changes nothing."""

    verification_id: str
    attempt: int
    worker: str

    def start(self) -> StartedAttempt | None:
        """Take the attempt; None when there is nothing to run (another worker has it, or it ended)."""

    def heartbeat(self, progress: dict[str, Any] | None) -> bool:
        """Liveness and progress; False once the attempt is no longer this worker's."""

    def record_verdict(self, report: dict[str, Any]) -> bool:
        """Store the verdict; False when it was not recorded (a stale attempt)."""

    def record_shard(self, shard: int, shards: int, payload: dict[str, Any]) -> bool:
        """Store one shard's part of gate 1 (the last one stored writes the verdict); False when refused."""

    def end_without_verdict(self, reason: str, *, give_up: bool = False) -> None:
        """The attempt ends without a verdict: retried while attempts remain, or (give_up) failed now."""

    def close(self) -> None:
        """Release the channel's connections."""
