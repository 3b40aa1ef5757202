"""The dispatcher contract. Implementations are listed explicitly by name (no import side effects);
one generic loop (`loop.py`) drives any of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session

from engine.errors import ConvgateError


class LaunchError(ConvgateError):
    """A dispatcher could not start a worker; `cluster_status` is the short form operators see next to the
    verification (None: nothing to add to the message)."""

    code = "dispatch.launch_failed"
    cluster_status: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerExit:
    verification_id: str
    attempt: int  # the attempt this worker was launched for
    reason: str  # e.g. "exit code 1", "killed by signal 9", "Job failed: DeadlineExceeded"
    clean: bool  # exit code 0: the worker recorded its own outcome (ending the attempt is then a no-op)


class Dispatcher(Protocol):
    name: str
    identity: str  # recorded as the verification's worker, e.g. "local:host:pid"

    def capacity(self) -> int:
        """How many more verifications may start now."""

    def launch(self, verification_id: str, attempt: int, attempt_secret: str | None = None,
               shards: int = 1) -> None:
        """Start `convgate worker run --verification-id ID --attempt N` somewhere: the worker may start
        only that attempt (the number the claim assigned). `attempt_secret` is what a restricted worker
        authenticates with (`CONVGATE_ATTEMPT_SECRET`); a dispatcher whose workers hold the service's
        own URL may ignore it. `shards` > 1: gate 1 split over that many workers (a Kubernetes Indexed
        Job); only a dispatcher that can start them together (Kueue's all-or-nothing admission) shards."""

    def reap(self) -> list[WorkerExit]:
        """Workers that ended since the last call."""

    def active(self) -> set[str]:
        """Verification ids with a live worker of this dispatcher."""

    def cancel(self, verification_id: str) -> None:
        """Stop the worker of a cancelled verification."""

    def owns_dead(self, worker: str | None) -> bool:
        """True when `worker` names a worker of an earlier instance of this dispatcher that is gone."""

    def sync(self, session: Session) -> None:
        """Bring cluster-side facts (admission, queue position) into the database; may be a no-op."""

    def shutdown(self) -> None: ...
