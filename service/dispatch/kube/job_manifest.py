"""The batch/v1 Job for one verification attempt: suspended for Kueue, CPU/memory/ephemeral-storage
only (never an accelerator), restricted pod security, no service-account token, read-only root
filesystem with a size-limited scratch volume for the artifact cache."""

from __future__ import annotations

import base64
import json
from typing import Any

from service.config import KubernetesSettings, Settings
from service.persistence.attempt_contract import ATTEMPT_SECRET_ENV

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
VERIFICATION_LABEL = "convgate.io/verification-id"
ATTEMPT_LABEL = "convgate.io/attempt"
APP_LABELS = {"app.kubernetes.io/name": "convgate", "app.kubernetes.io/component": "worker"}
ALLOWED_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
SCRATCH = "/scratch"
WORKER_UID = 10001
ATTEMPT_SECRET_KEY = "secret"


def job_name(verification_id: str, attempt: int) -> str:
    """Deterministic, so a retried create of the same attempt can only ever find its own Job."""
    return f"convgate-{verification_id}-{attempt}"


def _resources(kube: KubernetesSettings) -> dict[str, dict[str, str]]:
    return {
        "requests": {"cpu": kube.cpu_request, "memory": kube.memory_request,
                     "ephemeral-storage": kube.ephemeral_storage_request},
        "limits": {"cpu": kube.cpu_limit, "memory": kube.memory_limit,
                   "ephemeral-storage": kube.ephemeral_storage_limit},
    }


def attempt_secret_name(verification_id: str, attempt: int) -> str:
    """The per-attempt Secret: one per Job, owned by it (ownerReferences), so it goes when the Job goes."""
    return f"{job_name(verification_id, attempt)}-attempt"


def _database_env(kube: KubernetesSettings, verification_id: str, attempt: int) -> list[dict[str, Any]]:
    """With a worker database Secret: the restricted login's URL and this attempt's own secret (from its
    per-attempt Secret: `view` RBAC, which reads Jobs and pods, does not read Secrets). The reference is
    optional, so a pod whose Secret never came (the dispatcher died in between) starts, finds no secret,
    and fails at once instead of waiting for it until the deadline. Without: the service's own URL."""
    if kube.worker_database_secret is None:
        return [{"name": "CONVGATE_DATABASE_URL",
                 "valueFrom": {"secretKeyRef": {"name": kube.database_secret, "key": kube.database_secret_key}}}]
    return [
        {"name": "CONVGATE_DATABASE_URL", "valueFrom": {"secretKeyRef": {
            "name": kube.worker_database_secret, "key": kube.worker_database_secret_key}}},
        {"name": ATTEMPT_SECRET_ENV, "valueFrom": {"secretKeyRef": {
            "name": attempt_secret_name(verification_id, attempt), "key": ATTEMPT_SECRET_KEY, "optional": True}}},
    ]


def build_attempt_secret(kube: KubernetesSettings, verification_id: str, attempt: int, secret: str,
                         job_uid: str) -> dict[str, Any]:
    """The Secret holding one attempt's secret, owned by that attempt's Job, immutable."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
        "metadata": {"name": attempt_secret_name(verification_id, attempt), "namespace": kube.namespace,
                     "labels": {**APP_LABELS, VERIFICATION_LABEL: verification_id, ATTEMPT_LABEL: str(attempt)},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                          "name": job_name(verification_id, attempt), "uid": job_uid,
                                          "blockOwnerDeletion": False}]},
        "data": {ATTEMPT_SECRET_KEY: base64.b64encode(secret.encode()).decode()},
    }


def _env(settings: Settings, verification_id: str, attempt: int) -> list[dict[str, Any]]:
    kube = settings.kubernetes
    env: list[dict[str, Any]] = [
        *_database_env(kube, verification_id, attempt),
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "CONVGATE_CACHE_DIR", "value": f"{SCRATCH}/cache"},
        {"name": "HOME", "value": f"{SCRATCH}/home"},
        {"name": "TMPDIR", "value": f"{SCRATCH}/tmp"},
        {"name": "HF_HOME", "value": f"{SCRATCH}/hf"},
        # the same file:// rule the service applied when it accepted the request (false in the chart)
        {"name": "CONVGATE_ALLOW_FILE_URIS", "value": "true" if settings.allow_file_uris else "false"},
        {"name": "CONVGATE_LEASE_SECONDS", "value": str(settings.lease_seconds)},
        # the worker re-checks every URI with the same policy the service applied at submission
        {"name": "CONVGATE_FILE_ROOTS", "value": json.dumps([str(root) for root in settings.file_roots])},
        {"name": "CONVGATE_FETCH_ATTEMPTS", "value": str(settings.fetch_attempts)},
        {"name": "CONVGATE_FETCH_BACKOFF_SECONDS", "value": str(settings.fetch_backoff_seconds)},
        {"name": "CONVGATE_FETCH_MAX_BACKOFF_SECONDS", "value": str(settings.fetch_max_backoff_seconds)},
    ]
    if settings.allowed_hosts is not None:
        env.append({"name": "CONVGATE_ALLOWED_HOSTS", "value": json.dumps(list(settings.allowed_hosts))})
    if settings.trusted_hosts:
        env.append({"name": "CONVGATE_TRUSTED_HOSTS", "value": json.dumps(list(settings.trusted_hosts))})
    if settings.hf_endpoint:
        env.append({"name": "CONVGATE_HF_ENDPOINT", "value": settings.hf_endpoint})
    return env


def _sharded(spec: dict[str, Any], kube: KubernetesSettings, shards: int) -> None:
    """An Indexed Job of `shards` pods (gate 1 split, one completion index each), admitted by Kueue as one
    workload: they start together or not at all. A failed pod is retried for its index alone, up to
    `shard_retries` times; an index out of retries fails the Job (and so the attempt)."""
    spec.pop("backoffLimit")  # counts failures of every index together; per index below
    spec.update({"completionMode": "Indexed", "completions": shards, "parallelism": shards,
                 "backoffLimitPerIndex": kube.shard_retries, "maxFailedIndexes": 0})


def build_job(settings: Settings, verification_id: str, attempt: int, shards: int = 1) -> dict[str, Any]:
    """The attempt's Job: one pod, or (`shards` > 1) an Indexed Job whose pods share the Job's name as
    their worker name, so they run one attempt together."""
    kube = settings.kubernetes
    labels = {**APP_LABELS, QUEUE_LABEL: kube.local_queue, VERIFICATION_LABEL: verification_id,
              ATTEMPT_LABEL: str(attempt)}
    if kube.priority_class:
        labels[PRIORITY_LABEL] = kube.priority_class
    container = {
        "name": "worker",
        "image": kube.image,
        "imagePullPolicy": kube.image_pull_policy,
        "command": ["convgate", "worker", "run", "--verification-id", verification_id, "--attempt", str(attempt),
                    "--worker-name", "$(POD_NAME)" if shards == 1 else job_name(verification_id, attempt)],
        "env": _env(settings, verification_id, attempt),
        "resources": _resources(kube),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH}],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": kube.service_account,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": WORKER_UID, "runAsGroup": WORKER_UID,
                            "fsGroup": WORKER_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": kube.scratch_size_limit}}],
    }
    if kube.node_selector:
        pod_spec["nodeSelector"] = dict(kube.node_selector)
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(verification_id, attempt), "namespace": kube.namespace, "labels": labels},
        "spec": {
            "suspend": True,
            "backoffLimit": kube.backoff_limit,
            # a pod evicted or preempted (DisruptionTarget) is replaced without counting as a failure;
            # convgate's own accounting then sees a new worker take over the same attempt's Job
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
            "activeDeadlineSeconds": kube.active_deadline_seconds,
            "ttlSecondsAfterFinished": kube.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    if shards > 1:
        _sharded(job["spec"], kube, shards)
    return job
