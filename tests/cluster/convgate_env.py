"""convgate on the real cluster: per-test namespaces and queues, the chart's RBAC, a database Secret,
service replicas (dispatch loops) that talk to the API server with a ServiceAccount token, and
what the tests observe (Jobs, Workloads, verdicts, digests, events).

Every scenario gets its own namespace (labelled pod-security `restricted`), ClusterQueue and
LocalQueue, and the chart's ServiceAccounts, Role and RoleBinding rendered by the real helm
(`helm template --show-only`), so the Role the chart ships is what the API server enforces on the
dispatcher in every scenario, not only in the chart test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from service.config import KubernetesSettings, Settings
from service.dispatch.loop import DispatchLoop
from service.persistence import repository
from service.persistence.clock import SYSTEM_CLOCK, Clock
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.models import FileDigestRecord, Verdict, Verification
from service.schemas import SubmitRequest
from service.verifications import admit, submit

from .api import Api
from .cluster import REPO, Cluster
from .pod_runner import PodRunner

HELM = REPO / ".fixtures" / "tools" / "helm"
CHART = REPO / "deploy" / "helm" / "convgate"
MINILM = REPO / ".fixtures" / "minilm"
RELEASE = "convgate"  # the release name the RBAC is rendered for: ServiceAccount `convgate`
JOB_PREFIX = "convgate-"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"
JOBS = "/apis/batch/v1/namespaces/{ns}/jobs"


def helm() -> Path:
    if not HELM.exists():
        pytest.skip("helm is not built: python scripts/build_fixtures.py --out .fixtures tools")
    return HELM


def chart_objects(namespace: str, *templates: str, values: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """`helm template` of the chart (only `templates`, when given) for release `convgate`."""
    argv = [str(helm()), "template", RELEASE, str(CHART), "--namespace", namespace, *values]
    for template in templates:
        argv += ["--show-only", f"templates/{template}"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def minilm_request() -> SubmitRequest:
    artifact = MINILM / "minilm-Q8_0.gguf"
    if not artifact.exists() or not (MINILM / "source").is_dir():
        pytest.skip("MiniLM fixtures are not built (python scripts/build_fixtures.py)")
    from engine.digests import sha256_file

    return SubmitRequest(source_uri=(MINILM / "source").as_uri(), artifact_uri=artifact.as_uri(),
                         artifact_sha256=sha256_file(artifact), gates=[1])


def wait(what: str, check: Callable[[], Any], timeout: float = 120.0, interval: float = 0.2) -> Any:
    return Api.wait(what, check, timeout=timeout, interval=interval)


@dataclass
class Scenario:
    """One namespace with its queue, Secret and RBAC; `settings()` for the service replicas in it."""

    cluster: Cluster
    namespace: str
    database_url: str
    workdir: Path
    cpu_quota: str = "1"
    preemption: bool = False
    kubeconfig: Path | None = None

    @property
    def api(self) -> Api:
        return self.cluster.api

    def create(self) -> Scenario:
        api = self.api
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest"}}})
        for path in ("resource-flavor.yaml", "priority-classes.yaml"):
            api.apply_yaml(REPO / "manifests" / "kueue" / path)
        resources = [{"name": "cpu", "nominalQuota": self.cpu_quota}, {"name": "memory", "nominalQuota": "64Gi"},
                     {"name": "ephemeral-storage", "nominalQuota": "64Gi"}]
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": ["cpu", "memory", "ephemeral-storage"],
                                "flavors": [{"name": "convgate-cpu", "resources": resources}]}]}
        if self.preemption:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                   "metadata": {"name": self.namespace}, "spec": spec})
        api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                   "metadata": {"name": "convgate", "namespace": self.namespace},
                   "spec": {"clusterQueue": self.namespace}})
        wait(f"ClusterQueue {self.namespace} active", lambda: any(
            c["type"] == "Active" and c["status"] == "True" for c in api.get(
                f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{self.namespace}").get("status", {}).get(
                "conditions", [])), timeout=30)
        for obj in chart_objects(self.namespace, "serviceaccount.yaml", "role.yaml"):
            api.apply(obj, self.namespace)
        self.set_database_url(self.database_url)
        token = self.cluster.service_account_token(self.namespace, RELEASE)
        self.kubeconfig = self.cluster.write_kubeconfig(self.workdir / f"{self.namespace}.kubeconfig",
                                                        token=token, namespace=self.namespace)
        return self

    def set_database_url(self, url: str) -> None:
        self.api.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "convgate-database", "namespace": self.namespace}, "stringData": {"url": url}})

    def settings(self, **overrides: Any) -> Settings:
        kube = KubernetesSettings(
            namespace=self.namespace, local_queue="convgate", priority_class="convgate-batch",
            service_account=f"{RELEASE}-worker", in_cluster=False, kubeconfig=self.kubeconfig,
            cpu_request="1", cpu_limit="1", memory_request="2Gi", memory_limit="2Gi",
            ephemeral_storage_request="1Gi", ephemeral_storage_limit="2Gi", scratch_size_limit="2Gi",
            active_deadline_seconds=600, ttl_seconds_after_finished=600, api_timeout_seconds=5,
            retry_backoff_seconds=0.1, create_pause_seconds=1, deleted_job_grace_seconds=5,
            **overrides.pop("kube", {}))
        values: dict[str, Any] = {
            "database_url": self.database_url, "dispatcher": "kubernetes", "cache_dir": self.workdir / "cache",
            "poll_seconds": 0.3, "lease_seconds": 4.0, "allow_file_uris": True, "file_roots": (MINILM,),
            "max_attempts": 3, "kubernetes": kube}
        return Settings(**(values | overrides))

    # --- what the tests look at ----------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        return [j for j in self.api.get(JOBS.format(ns=self.namespace))["items"]
                if j["metadata"]["name"].startswith(JOB_PREFIX)]

    def job_names(self, verification_id: str) -> list[str]:
        return sorted(j["metadata"]["name"] for j in self.jobs() if verification_id in j["metadata"]["name"])

    def workloads(self) -> list[dict[str, Any]]:
        return self.api.get(WORKLOADS.format(ns=self.namespace))["items"]

    def blocker(self, name: str, *, cpu: str = "1", seconds: int = 600, priority: str | None = None) -> None:
        """A plain Job in the LocalQueue that holds `cpu` of the quota while it sleeps."""
        labels = {"kueue.x-k8s.io/queue-name": "convgate"}
        if priority:
            labels["kueue.x-k8s.io/priority-class"] = priority
        restricted = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 10001,
                      "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
        self.api.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
                         "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": {
                             "restartPolicy": "Never", "containers": [{
                                 "name": "main", "image": "python:3.11-slim", "securityContext": restricted,
                                 "command": ["python3", "-c", f"import time; time.sleep({seconds})"],
                                 "resources": {"requests": {"cpu": cpu, "memory": "64Mi"},
                                               "limits": {"cpu": cpu, "memory": "64Mi"}}}]}}}}, self.namespace)

    def delete_job(self, name: str) -> None:
        self.api.delete(f"{JOBS.format(ns=self.namespace)}/{name}", params={"propagationPolicy": "Background"})


class AheadClock:
    """The system's time plus `seconds`: a replica on this clock sees every stored time as that much
    older, as if it had started that much later, without the test waiting for it."""

    def __init__(self, seconds: float) -> None:
        self.ahead = timedelta(seconds=seconds)

    def now(self) -> datetime:
        return SYSTEM_CLOCK.now() + self.ahead


class Replica:
    """One service replica's dispatch loop (its own engine and Kubernetes client), in a thread."""

    def __init__(self, settings: Settings, clock: Clock = SYSTEM_CLOCK) -> None:
        self.settings = settings
        self.engine = make_engine(settings.database_url)
        self.factory = session_factory(self.engine, clock)
        self.loop = DispatchLoop.for_settings(settings, self.factory)

    def wait_ticks(self, ticks: int, timeout: float = 60) -> None:
        """Until the dispatch loop has run `ticks` more ticks."""
        target = self.loop.ticks + ticks
        wait(f"{ticks} dispatch ticks", lambda: self.loop.ticks >= target, timeout=timeout)

    def start(self) -> Replica:
        self.loop.start()
        return self

    def stop(self) -> None:
        self.loop.stop()
        self.engine.dispose()


@dataclass
class Db:
    """Reads and writes the verifications table directly."""

    url: str
    settings: Settings
    engine: Any = field(init=False)

    def __post_init__(self) -> None:
        self.engine = make_engine(self.url)
        self.factory = session_factory(self.engine)

    def submit(self, request: SubmitRequest | None = None, submitter: str = "alice") -> str:
        with transaction(self.factory) as session:
            admitted = admit(self.settings, request or minilm_request())
            return submit(session, self.settings, submitter, admitted, None)[0].id

    def get(self, verification_id: str) -> Verification:
        with self.factory() as session:
            verification = repository.get_verification(session, verification_id)
            assert verification is not None
            session.expunge(verification)
            return verification

    def events(self, verification_id: str) -> list[str]:
        with self.factory() as session:
            return [e.message for e in repository.events(session, verification_id)]

    def verdicts(self, verification_id: str) -> int:
        with self.factory() as session:
            return int(session.scalar(select(func.count()).select_from(Verdict).where(
                Verdict.verification_id == verification_id)) or 0)

    def digests(self, verification_id: str) -> dict[str, str]:
        with self.factory() as session:
            rows = session.execute(select(FileDigestRecord.uri, FileDigestRecord.sha256).join(
                Verdict, Verdict.id == FileDigestRecord.verdict_id).where(Verdict.verification_id == verification_id))
            return {uri: sha for uri, sha in rows}

    def report(self, verification_id: str) -> dict[str, Any]:
        with self.factory() as session:
            verdict = repository.verdict_for(session, verification_id)
            assert verdict is not None
            return dict(verdict.report)

    def state(self, verification_id: str) -> str:
        return self.get(verification_id).state

    def wait_state(self, verification_id: str, *states: str, timeout: float = 180) -> Verification:
        wait(f"{verification_id} in {states}", lambda: self.state(verification_id) in states, timeout=timeout)
        return self.get(verification_id)

    def close(self) -> None:
        self.engine.dispose()


def worker_pid(runner: PodRunner, namespace: str, verification_id: str) -> int | None:
    """The running worker process of the verification's Job pod, if any."""
    for work in list(runner._work.values()):
        if work.namespace == namespace and verification_id in work.name:
            proc = work.procs.get("worker")
            if proc is not None and proc.poll() is None:
                return proc.pid
    return None


@contextlib.contextmanager
def held_worker(runner: PodRunner, namespace: str, *verification_ids: str, timeout: float = 120) -> Iterator[str]:
    """Stop (SIGSTOP) the first worker of these verifications that runs, so it stays running for the
    test; yields its verification id (Kueue orders workloads created in the same second by more than
    creation time, so which of several is admitted first is not ours to assume)."""

    def running() -> tuple[str, int] | None:
        for verification_id in verification_ids:
            pid = worker_pid(runner, namespace, verification_id)
            if pid is not None:
                return verification_id, pid
        return None

    verification_id, pid = wait(f"a worker of {verification_ids} running", running, timeout=timeout, interval=0.05)
    os.killpg(pid, signal.SIGSTOP)
    try:
        yield verification_id
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)


def run_in_threads(*functions: Callable[[], None]) -> None:
    threads = [threading.Thread(target=f, daemon=True) for f in functions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def elapsed(t0: float) -> str:
    return f"{time.monotonic() - t0:.1f}s"
