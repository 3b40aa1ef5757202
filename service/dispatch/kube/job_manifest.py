"""The batch/v1 Job for one verification attempt: suspended for Kueue, CPU/memory/ephemeral-storage
only (never an accelerator), restricted pod security, no service-account token, read-only root
filesystem with a size-limited scratch volume for the artifact cache."""

from __future__ import annotations

import json
from typing import Any

from service.config import KubernetesSettings, Settings

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
VERIFICATION_LABEL = "convgate.io/verification-id"
ATTEMPT_LABEL = "convgate.io/attempt"
APP_LABELS = {"app.kubernetes.io/name": "convgate", "app.kubernetes.io/component": "worker"}
ALLOWED_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage"})
SCRATCH = "/scratch"
WORKER_UID = 10001


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


def _env(settings: Settings) -> list[dict[str, Any]]:
    kube = settings.kubernetes
    env: list[dict[str, Any]] = [
        {"name": "CONVGATE_DATABASE_URL",
         "valueFrom": {"secretKeyRef": {"name": kube.database_secret, "key": kube.database_secret_key}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "CONVGATE_CACHE_DIR", "value": f"{SCRATCH}/cache"},
        {"name": "HOME", "value": f"{SCRATCH}/home"},
        {"name": "TMPDIR", "value": f"{SCRATCH}/tmp"},
        {"name": "HF_HOME", "value": f"{SCRATCH}/hf"},
        # the same file:// rule the service applied when it accepted the request (false in the chart)
        {"name": "CONVGATE_ALLOW_FILE_URIS", "value": "true" if settings.allow_file_uris else "false"},
        {"name": "CONVGATE_LEASE_SECONDS", "value": str(settings.lease_seconds)},
    ]
    if settings.allowed_hosts is not None:
        env.append({"name": "CONVGATE_ALLOWED_HOSTS", "value": json.dumps(list(settings.allowed_hosts))})
    if settings.trusted_hosts:
        env.append({"name": "CONVGATE_TRUSTED_HOSTS", "value": json.dumps(list(settings.trusted_hosts))})
    if settings.hf_endpoint:
        env.append({"name": "CONVGATE_HF_ENDPOINT", "value": settings.hf_endpoint})
    return env


def build_job(settings: Settings, verification_id: str, attempt: int) -> dict[str, Any]:
    kube = settings.kubernetes
    labels = {**APP_LABELS, QUEUE_LABEL: kube.local_queue, VERIFICATION_LABEL: verification_id,
              ATTEMPT_LABEL: str(attempt)}
    if kube.priority_class:
        labels[PRIORITY_LABEL] = kube.priority_class
    container = {
        "name": "worker",
        "image": kube.image,
        "imagePullPolicy": kube.image_pull_policy,
        "command": ["convgate", "worker", "run", "--verification-id", verification_id,
                    "--worker-name", "$(POD_NAME)"],
        "env": _env(settings),
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
    return {
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
