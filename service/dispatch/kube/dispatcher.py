"""The Kubernetes dispatcher: one suspended batch/v1 Job per attempt in a Kueue LocalQueue, with
Job and Workload state (and queue positions from Kueue's visibility API) brought back into the
database by polling."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from sqlalchemy.orm import Session

from service.config import Settings
from service.dispatch.base import WorkerExit
from service.dispatch.kube.cluster_state import job_status
from service.dispatch.kube.errors import RETRYABLE_STATUS, KubeError, is_already_exists, is_not_found, translate
from service.dispatch.kube.job_manifest import APP_LABELS, ATTEMPT_LABEL, VERIFICATION_LABEL, build_job
from service.persistence import repository

log = logging.getLogger("convgate.kubernetes")
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
VISIBILITY_PATH = "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues/{name}/pendingworkloads"


def api_client_for(settings: Settings) -> k8s.ApiClient:
    if settings.kubernetes.in_cluster:
        k8s_config.load_incluster_config()
    else:
        k8s_config.load_kube_config()
    return k8s.ApiClient()


class KubernetesDispatcher:
    name = "kubernetes"

    def __init__(self, settings: Settings, api_client: k8s.ApiClient | None = None) -> None:
        self.settings = settings
        self.kube = settings.kubernetes
        self.api = api_client or api_client_for(settings)
        self.batch = k8s.BatchV1Api(self.api)
        self.custom = k8s.CustomObjectsApi(self.api)
        self.identity = f"kubernetes:{self.kube.namespace}/{self.kube.local_queue}"
        self.jobs: dict[str, dict[str, Any]] = {}  # verification id -> its newest Job
        self.workloads: dict[str, dict[str, Any]] = {}  # job uid -> Workload
        self.positions: dict[str, int] = {}  # job name -> position in the LocalQueue
        self.reported: set[str] = set()

    # --- API calls, each translated once ---------------------------------------------------

    def _call(self, action: str, function, *args, **kwargs):
        try:
            return function(*args, _request_timeout=self.kube.api_timeout_seconds, **kwargs)
        except Exception as exc:
            raise translate(exc, action) from exc

    def create_job(self, body: dict[str, Any]) -> None:
        """Create, retrying transient failures; an AlreadyExists answer means an earlier try worked."""
        name = body["metadata"]["name"]
        for attempt in range(self.kube.create_attempts):
            try:
                # the client serializes plain dicts as they are; the model class adds nothing here
                self.batch.create_namespaced_job(self.kube.namespace, cast(Any, body),
                                                 _request_timeout=self.kube.api_timeout_seconds)
                return
            except Exception as exc:
                if is_already_exists(exc):
                    log.info("job %s already exists: created by an earlier try", name)
                    return
                error = translate(exc, f"create job {name}")
                if not error.retryable or attempt + 1 == self.kube.create_attempts:
                    raise error from exc
                time.sleep(self.kube.retry_backoff_seconds * 2**attempt)

    def delete_job(self, name: str) -> None:
        try:
            self.batch.delete_namespaced_job(name, self.kube.namespace, propagation_policy="Background",
                                             _request_timeout=self.kube.api_timeout_seconds)
        except Exception as exc:
            if not is_not_found(exc):
                raise translate(exc, f"delete job {name}") from exc

    def pending_positions(self) -> dict[str, int]:
        """Job name -> position in the LocalQueue, from the visibility API.

        CustomObjectsApi would escape the `/` of the `pendingworkloads` subresource into the name,
        so the path is templated here and only the path parameters are escaped."""
        method, url, headers, body, post_params = self.api.param_serialize(
            "GET", VISIBILITY_PATH, path_params={"namespace": self.kube.namespace, "name": self.kube.local_queue},
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        answer = self._call("read pending workloads", self.api.call_api, method, url, headers, body, post_params)
        answer.read()
        if answer.status >= 400:
            raise KubeError(f"read pending workloads: HTTP {answer.status}", status=answer.status,
                            retryable=answer.status in RETRYABLE_STATUS)
        response = json.loads(answer.data or b"{}")
        positions = {}
        for item in (response or {}).get("items", []):
            for owner in item.get("metadata", {}).get("ownerReferences", []):
                if owner.get("kind") == "Job":
                    positions[owner["name"]] = int(item.get("positionInLocalQueue", 0))
        return positions

    def refresh(self) -> None:
        selector = ",".join(f"{k}={v}" for k, v in APP_LABELS.items())
        jobs = self._call("list jobs", self.batch.list_namespaced_job, self.kube.namespace, label_selector=selector)
        newest: dict[str, dict[str, Any]] = {}
        for job in self.api.sanitize_for_serialization(jobs).get("items", []):
            labels = job["metadata"].get("labels", {})
            verification_id = labels.get(VERIFICATION_LABEL)
            if verification_id is None:
                continue
            attempt = int(labels.get(ATTEMPT_LABEL, 0))
            if attempt >= int(newest.get(verification_id, {}).get("metadata", {}).get("labels", {}).get(
                    ATTEMPT_LABEL, -1)):
                newest[verification_id] = job
        workloads = self._call("list workloads", self.custom.list_namespaced_custom_object, "kueue.x-k8s.io",
                               "v1beta2", self.kube.namespace, "workloads")
        self.jobs = newest
        self.workloads = {w["metadata"].get("labels", {}).get(JOB_UID_LABEL): w for w in workloads.get("items", [])}
        self.positions = self.pending_positions()

    # --- the Dispatcher protocol -------------------------------------------------------------

    def _status(self, job: dict[str, Any]):
        return job_status(job, self.workloads.get(job["metadata"].get("uid")))

    def capacity(self) -> int:
        unfinished = sum(1 for job in self.jobs.values() if not self._status(job).job_finished)
        return max(self.kube.max_jobs_in_flight - unfinished, 0)

    def launch(self, verification_id: str, attempt: int) -> None:
        body = build_job(self.settings, verification_id, attempt)
        self.create_job(body)
        self.jobs[verification_id] = body | {"status": {}}

    def reap(self) -> list[WorkerExit]:
        exits = []
        for verification_id, job in self.jobs.items():
            name = job["metadata"]["name"]
            status = self._status(job)
            if status.job_finished and name not in self.reported:
                self.reported.add(name)
                attempt = int(job["metadata"]["labels"].get(ATTEMPT_LABEL, 0))
                exits.append(WorkerExit(verification_id, attempt, status.status,
                                        clean=status.job_failed_reason is None))
        return exits

    def active(self) -> set[str]:
        return {vid for vid, job in self.jobs.items() if not self._status(job).job_finished}

    def cancel(self, verification_id: str) -> None:
        job = self.jobs.get(verification_id)
        if job is not None:
            self.delete_job(job["metadata"]["name"])

    def owns_dead(self, worker: str | None) -> bool:
        return False  # the cluster is the source of truth for Jobs

    def sync(self, session: Session) -> None:
        """Record each verification's Kueue/Job status and queue position, with an event on change."""
        self.refresh()
        for verification_id, job in self.jobs.items():
            verification = repository.get_verification(session, verification_id)
            if verification is None:
                continue
            status = self._status(job).status
            position = self.positions.get(job["metadata"]["name"])
            repository.record_cluster_status(session, verification, status, position)

    def shutdown(self) -> None:
        self.api.close()


__all__ = ["KubeError", "KubernetesDispatcher"]
