"""What the dispatcher reads from and writes to the API server, each call translated once: Jobs
(create, list, delete), Workloads (list), the LocalQueue's pending workloads from Kueue's
visibility API, and a failed Job's pods (list, for the reason operators see)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from kubernetes import client as k8s

from service.config import KubernetesSettings
from service.dispatch.kube.errors import RETRYABLE_STATUS, KubeError, is_already_exists, is_not_found, translate
from service.dispatch.kube.job_manifest import APP_LABELS, ATTEMPT_LABEL, VERIFICATION_LABEL

log = logging.getLogger("convgate.kubernetes")
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
VISIBILITY_PATH = "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues/{name}/pendingworkloads"


class ClusterView:
    def __init__(self, api: k8s.ApiClient, kube: KubernetesSettings) -> None:
        self.api, self.kube = api, kube
        self.batch = k8s.BatchV1Api(api)
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.jobs: dict[str, dict[str, Any]] = {}  # verification id -> its newest Job
        self.workloads: dict[str, dict[str, Any]] = {}  # job uid -> Workload
        self.positions: dict[str, int] = {}  # job name -> position in the LocalQueue
        self.seen: set[str] = set()  # every Job name listed since this process started
        self.visibility_error: str | None = None

    def _call(self, action: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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
            self.seen.add(job["metadata"]["name"])
            attempt = int(labels.get(ATTEMPT_LABEL, 0))
            if attempt >= int(newest.get(verification_id, {}).get("metadata", {}).get("labels", {}).get(
                    ATTEMPT_LABEL, -1)):
                newest[verification_id] = job
        workloads = self._call("list workloads", self.custom.list_namespaced_custom_object, "kueue.x-k8s.io",
                               "v1beta2", self.kube.namespace, "workloads")
        self.jobs = newest
        self.workloads = {w["metadata"].get("labels", {}).get(JOB_UID_LABEL): w for w in workloads.get("items", [])}
        try:  # positions are for operators: without Kueue's visibility API the queue still moves
            self.positions, self.visibility_error = self.pending_positions(), None
        except KubeError as exc:
            if self.visibility_error is None:
                log.warning("queue positions unavailable: %s", exc)
            self.positions, self.visibility_error = {}, str(exc)

    def workload_of(self, job: dict[str, Any]) -> dict[str, Any] | None:
        return self.workloads.get(job["metadata"].get("uid"))

    def pod_failure(self, job: str) -> str | None:
        """How the failed Job's worker ended (e.g. "worker OOMKilled (exit code 137)"), from its pods."""
        try:
            pods = self._call(f"list pods of job {job}", self.core.list_namespaced_pod, self.kube.namespace,
                              label_selector=f"{JOB_NAME_LABEL}={job}")
        except KubeError as exc:
            log.warning("cannot read the pods of %s: %s", job, exc)
            return None
        outcomes = []
        for pod in self.api.sanitize_for_serialization(pods).get("items", []):
            for status in pod.get("status", {}).get("containerStatuses", []):
                terminated = status.get("state", {}).get("terminated")
                if terminated and terminated.get("exitCode", 0) != 0:
                    code, why = terminated["exitCode"], terminated.get("reason") or "Error"
                    outcomes.append(f"worker exited with code {code}" if why == "Error"
                                    else f"worker {why} (exit code {code})")
        return "; ".join(sorted(set(outcomes))) or None
