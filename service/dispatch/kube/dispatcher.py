"""The Kubernetes dispatcher: one suspended batch/v1 Job per attempt in a Kueue LocalQueue, with
Job and Workload state (and queue positions from Kueue's visibility API) brought back into the
database by polling (`cluster_view.py` reads; this module decides)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from sqlalchemy.orm import Session

from engine.errors import ConvgateError
from service.config import Settings
from service.dispatch.base import WorkerExit
from service.dispatch.kube.cluster_state import ClusterStatus, Phase, job_status
from service.dispatch.kube.cluster_view import ClusterView
from service.dispatch.kube.errors import KubeError
from service.dispatch.kube.job_manifest import (
    ATTEMPT_LABEL,
    attempt_secret_name,
    build_attempt_secret,
    build_job,
    job_name,
)
from service.dispatch.kube.secret_mirrors import SecretMirrors
from service.lifecycle import Reason, State
from service.persistence import repository
from service.persistence.clock import SYSTEM_CLOCK, Clock, as_utc, now
from service.persistence.models import Verification

log = logging.getLogger("convgate.kubernetes")


def api_client_for(settings: Settings) -> k8s.ApiClient:
    kube = settings.kubernetes
    if kube.in_cluster:
        k8s_config.load_incluster_config()
        return k8s.ApiClient()
    return k8s_config.new_client_from_config(config_file=str(kube.kubeconfig) if kube.kubeconfig else None)


class KubernetesDispatcher:
    name = "kubernetes"

    def __init__(self, settings: Settings, api_client: k8s.ApiClient | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock`: what the pause after a failed create is measured by (a test moves it instead of waiting)."""
        self.settings, self.clock = settings, clock
        self.kube = settings.kubernetes
        self.api = api_client or api_client_for(settings)
        self.view = ClusterView(self.api, self.kube)
        self.mirrors = SecretMirrors(self.kube.secret_mirrors, self.kube.namespace, self.kube.api_timeout_seconds)
        self.identity = f"kubernetes:{self.kube.namespace}/{self.kube.local_queue}"
        self.reported: set[str] = set()
        self.paused_until: datetime | None = None  # after a create failed for good (e.g. Kueue's webhook down)
        self.pause_reason: str | None = None
        # verification id -> how often the API server refused its Job for good (400/403/422), and the
        # last refusal; counted per process, so a restart allows `refused_creates_before_failing` more
        self.refusals: dict[str, tuple[int, KubeError]] = {}

    # --- the Dispatcher protocol -------------------------------------------------------------

    def _status(self, job: dict[str, Any]) -> ClusterStatus:
        return job_status(job, self.view.workload_of(job))

    def capacity(self) -> int:
        if self.paused_until is not None and self.clock.now() < self.paused_until:
            return 0
        unfinished = sum(1 for job in self.view.jobs.values() if not self._status(job).job_finished)
        return max(self.kube.max_jobs_in_flight - unfinished, 0)

    def launch(self, verification_id: str, attempt: int, attempt_secret: str | None = None,
               shards: int = 1) -> None:
        """Create the attempt's Job and, for restricted workers, the Secret holding `attempt_secret`
        (issued with the claim), owned by the Job so it is deleted with it."""
        restricted = self.kube.worker_database_secret is not None
        if restricted and not attempt_secret:
            raise ConvgateError(f"verification {verification_id}: a restricted worker needs its attempt secret")
        if restricted and attempt > 1:  # the previous attempt's, in case its Job never finished here
            self.mirrors.delete(attempt_secret_name(verification_id, attempt - 1))
        body = build_job(self.settings, verification_id, attempt, shards)
        try:
            uid = self.view.create_job(body)
            if restricted and attempt_secret:
                self._hand_over(body, build_attempt_secret(self.kube, verification_id, attempt, attempt_secret, uid))
        except KubeError as exc:
            self.paused_until = self.clock.now() + timedelta(seconds=self.kube.create_pause_seconds)
            self.pause_reason = str(exc)
            if exc.refused:
                self.refusals[verification_id] = (self.refusals.get(verification_id, (0, exc))[0] + 1, exc)
            raise
        self.paused_until, self.pause_reason = None, None
        self.refusals.pop(verification_id, None)
        self.view.jobs[verification_id] = body | {"status": {}}

    def _hand_over(self, job: dict[str, Any], secret: dict[str, Any]) -> None:
        """Create the attempt's Secret; if that fails, take the Job back (best effort), so no pod of an
        attempt that went back to the queue waits for a secret that will never come."""
        try:
            self.view.create_secret(secret)
            self.mirrors.create(secret)  # MultiKueue worker clusters: the copied Job's pods read it there
        except KubeError:
            try:
                self.view.delete_job(job["metadata"]["name"])
            except KubeError as exc:
                log.warning("could not delete %s after its Secret failed: %s", job["metadata"]["name"], exc)
            raise

    def reap(self) -> list[WorkerExit]:
        exits = []
        for verification_id, job in self.view.jobs.items():
            name = job["metadata"]["name"]
            status = self._status(job)
            if status.job_finished and name not in self.reported:
                self.reported.add(name)
                attempt = int(job["metadata"]["labels"].get(ATTEMPT_LABEL, 0))
                self.mirrors.delete(attempt_secret_name(verification_id, attempt))
                reason = status.status
                if status.job_failed_reason is not None:
                    reason = f"{reason}; {self.view.pod_failure(name) or 'no pod outcome recorded'}"
                exits.append(WorkerExit(verification_id, attempt, reason, clean=status.job_failed_reason is None))
        return exits

    def active(self) -> set[str]:
        return {vid for vid, job in self.view.jobs.items() if not self._status(job).job_finished}

    def cancel(self, verification_id: str) -> None:
        job = self.view.jobs.get(verification_id)
        if job is not None:
            self.view.delete_job(job["metadata"]["name"])
            self.mirrors.delete(attempt_secret_name(verification_id, int(job["metadata"]["labels"][ATTEMPT_LABEL])))

    def owns_dead(self, worker: str | None) -> bool:
        return False  # the cluster is the source of truth for Jobs: see `_lost_jobs`

    def sync(self, session: Session) -> None:
        """Record each verification's Kueue/Job status and queue position, with an event on change;
        end the attempts whose Job was deleted behind our back."""
        self.view.refresh()
        for verification_id, job in self.view.jobs.items():
            verification = repository.get_verification(session, verification_id)
            if verification is None:
                continue
            status = self._status(job)
            position = self.view.positions.get(job["metadata"]["name"])
            repository.record_cluster_status(session, verification, status.status, position)
            if status.phase is Phase.EVICTED and verification.state == State.RUNNING:  # wait for re-admission
                repository.release_evicted(session, verification_id, int(job["metadata"]["labels"][ATTEMPT_LABEL]),
                                           status.status, self.identity)
        self._lost_jobs(session)
        self._fail_refused(session)

    def _fail_refused(self, session: Session) -> None:
        """A verification whose Job the API server refused for good `refused_creates_before_failing`
        times fails with the server's reason instead of going round the queue for ever."""
        for verification_id, (count, error) in list(self.refusals.items()):
            if count < self.kube.refused_creates_before_failing:
                continue
            del self.refusals[verification_id]
            verification = repository.get_verification(session, verification_id)
            if verification is None or verification.state != State.QUEUED:
                continue  # cancelled meanwhile, or another replica got a Job created
            repository.record_cluster_status(session, verification, error.cluster_status, None)
            reason = str(error)
            if not repository.fail_unlaunchable(session, verification_id, reason,
                                                f"job refused by the API server {count} times: {reason}"):
                continue  # claimed or cancelled meanwhile: a conditional write, someone else won
            log.warning("verification %s failed: its Job was refused %s times: %s", verification_id, count, reason)

    def _expected_job(self, verification: Verification) -> str | None:
        """The Job that should exist for this verification's current attempt, if it is ours: dispatched by this
        dispatcher, or started by a pod of that Job (`<job name>-<suffix>`; a start is fenced by the attempt the
        row holds, so the row's number is the pod's)."""
        ours = job_name(verification.id, verification.attempt)
        if verification.state == State.DISPATCHED and verification.worker == self.identity:
            return ours
        if verification.state == State.RUNNING and (verification.worker or "").startswith(f"{ours}-"):
            return ours
        return None

    def _lost_jobs(self, session: Session) -> None:
        grace = timedelta(seconds=self.kube.deleted_job_grace_seconds)
        existing = {job["metadata"]["name"] for job in self.view.jobs.values()}
        for verification in repository.active(session, limit=10_000):
            expected = self._expected_job(verification)
            if expected is None or expected in existing:
                continue
            if expected in self.view.seen:
                reason = f"its Job {expected} was deleted outside convgate"
            elif as_utc(verification.updated_at) < now(session) - grace:
                reason = f"its Job {expected} never appeared (the dispatcher stopped before creating it?)"
            else:
                continue  # just claimed: another replica may be creating it right now
            log.warning("verification %s: %s", verification.id, reason)
            repository.end_attempt_without_verdict(session, verification.id, verification.attempt, Reason.JOB_LOST,
                                                   reason)

    def shutdown(self) -> None:
        self.api.close()
        self.mirrors.close()


__all__ = ["KubeError", "KubernetesDispatcher"]
