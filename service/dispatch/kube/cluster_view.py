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


def positions_from(summary: Any) -> dict[str, int]:
    """Job name -> position, from a PendingWorkloadsSummary; raises on any answer of another shape, so
    a half-read summary never shows wrong positions."""
    positions = {}
    for item in summary["items"] if summary else []:
        for owner in item["metadata"].get("ownerReferences") or []:
            if owner.get("kind") == "Job":
                position = item.get("positionInLocalQueue", 0)
                if not isinstance(position, int) or isinstance(position, bool) or not isinstance(owner["name"], str):
                    raise TypeError(f"pending workload entry of an unexpected shape: {item!r:.200}")
                positions[owner["name"]] = position
    return positions


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

    def _create(self, kind: str, body: dict[str, Any], create: Callable[..., Any]) -> Any | None:
        """Create, retrying transient failures; None when an AlreadyExists answer says an earlier try worked."""
        name = body["metadata"]["name"]
        for attempt in range(self.kube.create_attempts):
            try:
                # the client serializes plain dicts as they are; the model class adds nothing here
                return create(self.kube.namespace, cast(Any, body), _request_timeout=self.kube.api_timeout_seconds)
            except Exception as exc:
                if is_already_exists(exc):
                    log.info("%s %s already exists: created by an earlier try", kind, name)
                    return None
                error = translate(exc, f"create {kind} {name}")
                if not error.retryable or attempt + 1 == self.kube.create_attempts:
                    raise error from exc
                time.sleep(self.kube.retry_backoff_seconds * 2**attempt)
        raise AssertionError("unreachable: the last try raises")

    def create_job(self, body: dict[str, Any]) -> str:
        """Create the Job; returns its uid (read back when an earlier try had created it)."""
        created = self._create("job", body, self.batch.create_namespaced_job)
        if created is not None:
            return str(created.metadata.uid)
        return self.job_uid(body["metadata"]["name"])

    def job_uid(self, name: str) -> str:
        """Through `list` with a field selector: the Role needs no `get` on Jobs for this."""
        jobs = self._call(f"find job {name}", self.batch.list_namespaced_job, self.kube.namespace,
                          field_selector=f"metadata.name={name}")
        for job in self.api.sanitize_for_serialization(jobs).get("items", []):
            if job["metadata"]["name"] == name:
                return str(job["metadata"]["uid"])
        raise KubeError(f"job {name} exists but cannot be found", status=None, retryable=True)

    def create_secret(self, body: dict[str, Any]) -> None:
        """Create a Secret; AlreadyExists means an earlier try of the same attempt created it."""
        self._create("secret", body, self.core.create_namespaced_secret)

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
        try:
            return positions_from(json.loads(answer.data or b"{}"))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # the answer, not the call, is broken
            raise KubeError(f"read pending workloads: unreadable answer ({type(exc).__name__}: {exc})",
                            status=answer.status, retryable=True) from exc

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
