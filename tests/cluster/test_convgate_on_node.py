"""convgate's own images on the real node (issue 21, item 4): the chart installed with the real helm,
its migration hook, API Deployment and every verification Job run by kubelet + containerd + runc
(tests/cluster/node.py) from the images scripts/build_images.py builds, Jobs admitted by the real
Kueue, NetworkPolicies enforced by kube-router, verdicts in the real Postgres.

1. an honest verification runs gates 1, 2 and 3 in the worker container and ends GO, with its
   digests and its attestation in Postgres;
2. a worker whose memory limit is below what gate 2 needs is OOM-killed by the kernel, each attempt
   counted and named, and the verification fails when the attempts are spent;
3. the root filesystem is read-only and the user is not root: writes outside the volumes fail;
4. the API Deployment's pod serves /readyz and takes submissions through its Service (kubectl
   port-forward to the Service);
5. the migration hook runs `convgate db upgrade` in its own container and migrates a fresh database;
6. a sharded gate 1 runs as one Indexed Job of two pods that Kueue admits together, to one merged verdict;
7. a worker container killed through the runtime (containerd -> shim -> runc kill) loses no verdict
   and counts one failed attempt.

How the pods get what they need, honestly:
- the fixture files (MiniLM's source and its Q8_0 GGUF) are a hostPath PersistentVolume bound to a
  claim in the namespace (restricted pod security allows claims, not hostPath), mounted read-only at
  /models into worker pods by a MutatingAdmissionPolicy (GA in 1.36) — the platform-side injection a
  model store needs until the chart can mount one itself (see kube/README.md);
- Postgres stays on this machine's loopback: pods reach it through `KubeNode.relay`, on the node
  address, and the chart's NetworkPolicy names that port;
- the chart is installed with the api image (`image`) and the worker image (`worker.image`).

Still on the pod runner, because they need a fault or a pause the tests inject into a worker *process*
(SIGSTOP to hold it running, an OOM on request at a chosen shard): the issue-9 scenarios of
test_convgate_on_cluster.py (queue positions while held, restart while waiting, two replicas,
preemption and eviction while held, cancel while running, a Job deleted behind our back, crash and
OOM accounting, the restricted worker login, a shard killed once, Kueue down) and test_helm_chart.py
(an upgrade while a worker is held).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from sqlalchemy import create_engine, text

from service.auth import Role
from service.config import Settings
from service.lifecycle import State
from tests.conftest import built
from tests.databases import drop_database
from tests.service.conftest import PG_ADMIN, add_token

from .api import Api
from .cluster import REPO, Cluster, process_env
from .convgate_env import CHART, Db, helm, wait
from .node import KubeNode

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]  # the images may be built first

MODELS = "/models"  # where worker pods see the fixture files
WORKER_TIMEOUT = 900  # one worker start + gates 1-3 on MiniLM Q8_0, on 2 busy cores
RELEASE = "convgate"


def image_build_options(target: str) -> dict[str, Any]:
    """What dev.py passes to scripts/build_images.py (as tests/deploy does), so a warm run reuses its images."""
    from scripts import build_images

    if target != "worker":
        return {}
    import dev

    return {"llama_wheels": dev.llama_wheel().parent, "torch_index": build_images.PYPI_INDEX}


@pytest.fixture(scope="module")
def images(node: KubeNode) -> dict[str, str]:
    """target -> image reference, built (or reused) by scripts/build_images.py and loaded into containerd."""
    from scripts import build_images

    refs = {}
    for target in build_images.TARGETS:
        t0 = time.monotonic()
        built = build_images.build([target], **image_build_options(target))[target]
        (ref,) = node.load_image(Path(built.archive))
        refs[target] = ref
        print(f"image {target}: {ref} ready on the node in {time.monotonic() - t0:.1f}s")
    return refs


def minilm() -> Path:
    return built("minilm", "minilm-Q6_K.gguf")


def sha256(path: Path) -> str:
    from engine.digests import sha256_file

    return sha256_file(path)


@dataclass
class Deployment:
    """One `helm install` of the chart in its own namespace on the node, and what the tests use of it."""

    cluster: Cluster
    node: KubeNode
    namespace: str
    database_url: str  # the host's view (127.0.0.1)
    workdir: Path
    api_port: int = 0
    migration_pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    _forward: subprocess.Popen[str] | None = None

    @property
    def api(self) -> Api:
        return self.cluster.api

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def db(self) -> Db:
        return Db(self.database_url, Settings(database_url=self.database_url))

    def token(self, role: Role = Role.SUBMITTER) -> str:
        return add_token(self.database_url, role)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        """The pods matching `selector`, without those being deleted (a rolled-out replica's old pod)."""
        items = self.api.get(f"/api/v1/namespaces/{self.namespace}/pods", params={"labelSelector": selector})["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def worker_logs(self, verification_id: str, tail: int = 30) -> str:
        """The last lines of every worker container of the verification (for failure messages)."""
        out = []
        items = self.api.get(f"/api/v1/namespaces/{self.namespace}/pods",
                             params={"labelSelector": f"convgate.io/verification-id={verification_id}"})["items"]
        for p in items:
            with contextlib.suppress(Exception):
                log = self.api.get(f"/api/v1/namespaces/{self.namespace}/pods/{p['metadata']['name']}/log",
                                   params={"container": "worker", "tailLines": str(tail)})
                out.append(f"--- {p['metadata']['name']} ---\n{log}")
        return "\n".join(out)

    def exec(self, pod: str, container: str, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.node.kubectl("-n", self.namespace, "exec", pod, "-c", container, "--", *argv, check=False)

    def submit(self, http: httpx.Client, token: str, **overrides: Any) -> str:
        root = minilm()
        body = {"source_uri": f"file://{MODELS}/source", "artifact_uri": f"file://{MODELS}/minilm-Q8_0.gguf",
                "artifact_sha256": sha256(root / "minilm-Q8_0.gguf"), **overrides}
        r = http.post("/v1/verifications", json=body, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=60, trust_env=False)

    # --- installation ------------------------------------------------------------------------------
    def install(self, images: dict[str, str], values: dict[str, Any]) -> Deployment:
        t0 = time.monotonic()
        self._model_store()
        self._queue()
        self._helm_install(images, values)
        self.timings["helm install (hook included)"] = time.monotonic() - t0
        t1 = time.monotonic()
        self._rolled_out()
        self._port_forward()
        self.timings["API pod ready + port-forward"] = time.monotonic() - t1
        return self

    def _model_store(self) -> None:
        mount_model_store(self.api, self.namespace, minilm(), MODELS)

    def _queue(self) -> None:
        api, ns = self.api, self.namespace
        for path in ("resource-flavor.yaml", "priority-classes.yaml"):
            api.apply_yaml(REPO / "manifests" / "kueue" / path)
        resources = [{"name": "cpu", "nominalQuota": "2"}, {"name": "memory", "nominalQuota": "16Gi"},
                     {"name": "ephemeral-storage", "nominalQuota": "64Gi"}]
        api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": ns},
                   "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                            "queueingStrategy": "BestEffortFIFO",
                            "resourceGroups": [{"coveredResources": ["cpu", "memory", "ephemeral-storage"],
                                                "flavors": [{"name": "convgate-cpu", "resources": resources}]}]}})

    def _helm_install(self, images: dict[str, str], values: dict[str, Any]) -> None:
        relay_host, relay_port = self.node.relay(5432)
        pod_db = self.database_url.replace("@127.0.0.1:5432/", f"@{relay_host}:{relay_port}/")
        repository, tag = images["api"].rsplit(":", 1)
        worker_repository, worker_tag = images["worker"].rsplit(":", 1)
        merged = _merge({
            "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "api": {"replicas": 1, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                 "limits": {"cpu": "1", "memory": "1Gi"}}},
            "database": {"url": pod_db},
            "kueue": {"localQueue": "convgate", "createLocalQueue": True, "clusterQueue": self.namespace},
            "worker": {"image": {"repository": worker_repository, "tag": worker_tag},
                       "resources": {"requests": {"cpu": "500m", "memory": "2Gi", "ephemeral-storage": "1Gi"},
                                     "limits": {"cpu": "2", "memory": "3Gi", "ephemeral-storage": "4Gi"}},
                       "scratchSizeLimit": "4Gi", "activeDeadlineSeconds": 1200, "ttlSecondsAfterFinished": 3600},
            "dispatch": {"pollSeconds": 1, "leaseSeconds": 30, "maxAttempts": 3},
            "uriPolicy": {"allowFileUris": True, "fileRoots": [MODELS]},
            # kube-router enforces these: the database through the relay's port, the API server on its
            # Service port and on the port the `kubernetes` EndpointSlice names
            "networkPolicy": {"enabled": True, "databasePort": relay_port,
                              "kubernetesApiPorts": [443, self.cluster.api_port]},
        }, values)
        values_file = self.workdir / f"{self.namespace}-values.yaml"
        values_file.write_text(yaml.safe_dump(merged))
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch_migration, args=(stop,), daemon=True)
        watcher.start()
        try:
            self._helm("install", RELEASE, str(CHART), "--values", str(values_file), "--timeout", "10m")
        finally:
            stop.set()
            self.api.close_watches()
            watcher.join(5)

    def _watch_migration(self, stop: threading.Event) -> None:
        """The migration hook's pods as they were last seen (helm deletes the hook Job once it succeeded)."""
        with contextlib.suppress(Exception):
            for typ, obj in self.api.list_watch(f"/api/v1/namespaces/{self.namespace}/pods", stop,
                                                params={"labelSelector": "app.kubernetes.io/component=migration"}):
                for pod in obj["items"] if typ == "SYNC" else [obj]:
                    self.migration_pods[pod["metadata"]["name"]] = pod

    def _helm(self, *args: str) -> str:
        home = self.workdir / "helm"
        env = process_env({"HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
                           "HELM_DATA_HOME": str(home / "data")})
        result = subprocess.run([str(helm()), *args, "--kubeconfig", str(self.cluster.kubeconfig),
                                 "--namespace", self.namespace], capture_output=True, text=True, env=env,
                                timeout=900, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def _rolled_out(self) -> None:
        """Wait for the API Deployment's pod (helm install does not wait for it)."""
        ns = self.namespace

        def rolled_out() -> bool:
            d = self.api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{RELEASE}")
            st = d.get("status", {})
            return (st.get("observedGeneration") == d["metadata"]["generation"] and st.get("updatedReplicas") == 1
                    and st.get("readyReplicas") == 1 and st.get("replicas") == 1)

        wait("the API Deployment rolled out and ready", rolled_out, timeout=300)

    def _port_forward(self) -> None:
        self._forward = self.node.kubectl_popen("-n", self.namespace, "port-forward", f"svc/{RELEASE}", ":80")
        assert self._forward.stdout is not None
        line = self._forward.stdout.readline()
        m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) ->", line)
        assert m, line
        self.api_port = int(m.group(1))

    def uninstall(self) -> None:
        if self._forward is not None:
            self._forward.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._forward.communicate(timeout=10)
        ns, name = self.namespace, f"{self.namespace}-models"
        for path in (f"/api/v1/namespaces/{ns}",
                     f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{ns}",
                     f"/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings/{name}",
                     f"/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/{name}",
                     f"/api/v1/persistentvolumes/{name}"):
            with contextlib.suppress(Exception):
                self.api.delete(path)


def mount_model_store(api: Api, namespace: str, host_path: Path, mount: str | Path) -> None:
    """The fixture files at `host_path` as a read-only hostPath PersistentVolume, pre-bound to the claim
    `model-store` in `namespace`, and the MutatingAdmissionPolicy that mounts the claim at `mount` in that
    namespace's worker pods."""
    name = f"{namespace}-models"
    api.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "convgate-models", "hostPath": {"path": str(host_path), "type": "Directory"},
        "claimRef": {"namespace": namespace, "name": "model-store"}}})
    api.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "model-store", "namespace": namespace}, "spec": {
                   "accessModes": ["ReadOnlyMany"], "storageClassName": "convgate-models", "volumeName": name,
                   "resources": {"requests": {"storage": "1Gi"}}}})
    mutation = ('Object{spec: Object.spec{volumes: [Object.spec.volumes{name: "model-store", persistentVolumeClaim: '
                'Object.spec.volumes.persistentVolumeClaim{claimName: "model-store", readOnly: true}}], '
                'containers: [Object.spec.containers{name: "worker", volumeMounts: '
                f'[Object.spec.containers.volumeMounts{{name: "model-store", mountPath: "{mount}", '
                'readOnly: true}]}]}}')
    api.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
               "metadata": {"name": name}, "spec": {
                   "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                           "operations": ["CREATE"], "resources": ["pods"]}]},
                   "matchConditions": [{"name": "worker", "expression":
                                        "has(object.metadata.labels) && object.metadata.labels.exists(k, "
                                        "k == 'app.kubernetes.io/component' && "
                                        "object.metadata.labels[k] == 'worker')"}],
                   "failurePolicy": "Fail", "reinvocationPolicy": "Never",
                   "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": mutation}}]}})
    api.apply({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
               "metadata": {"name": name}, "spec": {"policyName": name, "matchResources": {
                   "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}}})
    wait("the model-store claim bound", lambda: api.get(
        f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/model-store").get("status", {}).get("phase") == "Bound",
        timeout=60)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    name = f"convgate_node_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError:
        pytest.skip("Postgres is not reachable")
    try:
        yield PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    finally:
        drop_database(PG_ADMIN, name)


@contextlib.contextmanager
def deployed(cluster: Cluster, node: KubeNode, images: dict[str, str], tmp: Path, prefix: str,
             values: dict[str, Any]) -> Iterator[Deployment]:
    with fresh_database() as url:
        namespace = node.namespace(f"{prefix}-{uuid.uuid4().hex[:5]}")
        deployment = Deployment(cluster, node, namespace, url, tmp)
        try:
            deployment.install(images, values)
            print(f"{prefix}: {json.dumps({k: round(v, 1) for k, v in deployment.timings.items()})}")
            yield deployment
        finally:
            deployment.uninstall()


@pytest.fixture(scope="module")
def main(cluster: Cluster, node: KubeNode, images: dict[str, str], tmp_path_factory: Any) -> Iterator[Deployment]:
    """The chart with gate 1 split over two pods for artifacts above 16 MiB (when the size is given)."""
    with deployed(cluster, node, images, tmp_path_factory.mktemp("main"), "cg-node",
                  {"worker": {"gate1ShardBytes": 16 << 20, "maxGate1Shards": 2}}) as deployment:
        yield deployment


def completed(deployment: Deployment, store: Db, verification_id: str, timeout: float = WORKER_TIMEOUT) -> Any:
    """Wait for the verification's end; its events and workers' last log lines are printed (shown when a
    test fails)."""
    verification = store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=timeout)
    print(f"{verification_id}: {verification.state} {verification.verdict_result} attempt {verification.attempt}, "
          f"failed {verification.failed_attempts}, reason {verification.reason!r}")
    print("\n".join(store.events(verification_id)))
    print(deployment.worker_logs(verification_id))
    return verification


def alembic_head() -> str:
    from alembic.script import ScriptDirectory

    from service.persistence.migrate import alembic_config

    return str(ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head())


# --- 5: the migration hook ---------------------------------------------------------------------------

def test_migration_hook_ran_in_its_container(main: Deployment, images: dict[str, str]) -> None:
    pods = list(main.migration_pods.values())
    assert pods, "no migration hook pod was seen"
    done = [p for p in pods if p.get("status", {}).get("phase") == "Succeeded"]
    assert done, [p.get("status") for p in pods]
    (status,) = done[-1]["status"]["containerStatuses"]
    assert status["name"] == "migrate" and status["state"]["terminated"]["exitCode"] == 0
    assert status["image"].endswith(images["api"].split("/", 1)[1]), status["image"]
    assert status["containerID"].startswith("containerd://")
    assert done[-1]["spec"]["nodeName"] == main.node.name
    engine = create_engine(main.database_url)
    with engine.connect() as connection:
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() == alembic_head()
    engine.dispose()


# --- 4: the API pod, through its Service ------------------------------------------------------------

def test_api_pod_serves_readyz_through_its_service(main: Deployment, images: dict[str, str]) -> None:
    (pod,) = main.pods("app.kubernetes.io/component=api")
    assert pod["spec"]["nodeName"] == main.node.name
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    with main.client() as http:
        assert http.get("/readyz").status_code == 200
        assert http.get("/healthz").status_code == 200


# --- 3: read-only root, not root ---------------------------------------------------------------------

def test_root_filesystem_is_read_only_and_the_user_is_not_root(main: Deployment) -> None:
    (pod,) = main.pods("app.kubernetes.io/component=api")
    name = pod["metadata"]["name"]
    who = main.exec(name, "api", "id", "-u")
    assert who.returncode == 0 and who.stdout.strip() == "10001", who
    for path in ("/app/written", "/opt/convgate/written", "/etc/written"):
        write = main.exec(name, "api", "sh", "-c", f"echo x > {path}")
        assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    scratch = main.exec(name, "api", "sh", "-c", "echo x > /scratch/written && cat /scratch/written")
    assert scratch.returncode == 0 and scratch.stdout.strip() == "x", scratch  # the emptyDir is writable


# --- 1: an honest verification, gates 1-3 in the worker container --------------------------------------

def test_honest_verification_runs_all_gates_in_the_worker_and_ends_go(main: Deployment,
                                                                     images: dict[str, str]) -> None:
    t0 = time.monotonic()
    token = main.token()
    with contextlib.closing(main.db()) as store, main.client() as http:
        verification_id = main.submit(http, token)
        verification = completed(main, store, verification_id)
        events = store.events(verification_id)
        assert (verification.state, verification.verdict_result) == (State.COMPLETED, "GO"), (
            events, store.report(verification_id).get("blockers") if store.verdicts(verification_id) else None)
        report = store.report(verification_id)
        assert {"storage", "runtime", "release"} <= set(report["gates"]), sorted(report["gates"])
        assert {g["status"] for g in report["gates"].values()} == {"passed"}, report["gates"]
        digests = store.digests(verification_id)
        artifact = f"file://{MODELS}/minilm-Q8_0.gguf"
        assert digests[artifact] == sha256(minilm() / "minilm-Q8_0.gguf")
        assert len(digests) > 5  # the artifact and every file of the source tree
        r = http.get(f"/v1/verifications/{verification_id}/attestation",
                     headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200, r.text
    engine = create_engine(main.database_url)
    with engine.connect() as connection:
        stored = connection.execute(text("SELECT envelope FROM attestations WHERE verification_id = :v"),
                                    {"v": verification_id}).scalar()
    engine.dispose()
    assert stored is not None and stored == r.json()
    payload = json.loads(base64.b64decode(stored["payload"]))
    assert any(s.get("digest", {}).get("sha256") == digests[artifact] for s in payload.get("subject", [])), payload
    selector = f"batch.kubernetes.io/job-name=convgate-{verification_id}-1"

    def worker_status() -> dict[str, Any]:
        (job_pod,) = main.pods(selector)
        assert job_pod["spec"]["nodeName"] == main.node.name
        return job_pod["status"]["containerStatuses"][0]

    # the verdict is recorded before the worker process exits: wait for the kubelet to see it end
    wait("the worker container terminated", lambda: "terminated" in worker_status()["state"], timeout=120)
    worker = worker_status()
    assert worker["image"].endswith(images["worker"].split("/", 1)[1])
    assert worker["state"]["terminated"]["exitCode"] == 0
    print(f"scenario 1 (gates 1-3 GO in the worker container): {time.monotonic() - t0:.1f}s")


# --- 6: gate 1 over an Indexed Job of two pods -------------------------------------------------------

def test_sharded_gate1_runs_as_one_indexed_job_to_a_merged_verdict(main: Deployment) -> None:
    t0 = time.monotonic()
    store = main.db()
    size = (minilm() / "minilm-Q8_0.gguf").stat().st_size  # ~24 MiB: two shards of 16 MiB
    with main.client() as http:
        verification_id = main.submit(http, main.token(), gates=[1], artifact_size=size)
    verification = completed(main, store, verification_id)
    events = store.events(verification_id)
    assert (verification.state, verification.verdict_result, verification.failed_attempts) == (
        State.COMPLETED, "GO", 0), events
    assert store.verdicts(verification_id) == 1
    job = main.api.get(f"/apis/batch/v1/namespaces/{main.namespace}/jobs/convgate-{verification_id}-1")
    assert (job["spec"]["completionMode"], job["spec"]["completions"]) == ("Indexed", 2)
    pods = main.pods(f"batch.kubernetes.io/job-name=convgate-{verification_id}-1")
    indexes = sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods)
    assert indexes == ["0", "1"] and all(p["spec"]["nodeName"] == main.node.name for p in pods)
    (workload,) = [w for w in main.api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{main.namespace}/workloads")[
        "items"] if verification_id in w["metadata"]["name"]]
    assert [podset["count"] for podset in workload["spec"]["podSets"]] == [2]
    assert store.report(verification_id)["gates"]["storage"]["details"]["shards"]["count"] == 2
    store.close()
    print(f"scenario 6 (gate 1 over an Indexed Job of 2 pods): {time.monotonic() - t0:.1f}s")


# --- 7: a worker killed through the runtime -----------------------------------------------------------

def test_worker_killed_through_the_runtime_loses_no_verdict_and_counts_one_attempt(main: Deployment) -> None:
    t0 = time.monotonic()
    store = main.db()
    with main.client() as http:
        # an inline policy without the labelled set: the retry runs a whole verification, and the kill and the
        # retry are what this test is about (the honest test above runs the default policy's set)
        verification_id = main.submit(http, main.token(Role.POLICY_AUTHOR), fresh=True,
                                      policy={"labelled_retrieval": False})
    job = f"convgate-{verification_id}-1"

    def running_pod() -> str | None:
        for p in main.pods(f"batch.kubernetes.io/job-name={job}"):
            statuses = p.get("status", {}).get("containerStatuses") or []
            if statuses and "running" in statuses[0]["state"]:
                return str(p["metadata"]["name"])
        return None

    pod = wait("the first attempt's worker container running", running_pod, timeout=WORKER_TIMEOUT, interval=0.2)
    wait("the worker claimed its attempt and is verifying", lambda: store.get(verification_id).state == State.RUNNING,
         timeout=WORKER_TIMEOUT, interval=0.2)
    # scenario 3 in the worker container too: read-only root, the uid the Job sets, a writable scratch
    who = main.exec(pod, "worker", "sh", "-c", "id -u; echo x > /opt/convgate/written")
    assert who.stdout.strip() == "10001" and "Read-only file system" in who.stderr, who
    main.node.kill_container(main.namespace, pod, "worker", "SIGKILL")
    verification = completed(main, store, verification_id)
    events = store.events(verification_id)
    assert store.verdicts(verification_id) == 1, events  # the retry wrote it, once
    assert (verification.attempt, verification.failed_attempts) == (2, 1), events
    assert any("exit" in e and "137" in e for e in events), events
    killed = main.api.get(f"/api/v1/namespaces/{main.namespace}/pods/{pod}")
    term = killed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 137 and term["reason"] != "OOMKilled", term
    store.close()
    print(f"scenario 7 (worker killed via containerd, retried): {time.monotonic() - t0:.1f}s")


# --- 2: OOM below gate 2's need -----------------------------------------------------------------------

def test_worker_below_gate2_memory_is_oom_killed_counted_and_failed(cluster: Cluster, node: KubeNode,
                                                                   images: dict[str, str],
                                                                   tmp_path: Path) -> None:
    """Its own release: a worker memory limit of 512 MiB (gate 2 loads torch, transformers and llama.cpp),
    two attempts allowed."""
    t0 = time.monotonic()
    values = {"worker": {"resources": {"requests": {"memory": "512Mi"}, "limits": {"memory": "512Mi"}}},
              "dispatch": {"maxAttempts": 2}}
    with deployed(cluster, node, images, tmp_path, "cg-oom", values) as oom:
        store = oom.db()
        with oom.client() as http:
            verification_id = oom.submit(http, oom.token())
        verification = completed(oom, store, verification_id)
        events = store.events(verification_id)
        assert (verification.state, verification.failed_attempts) == (State.FAILED, 2), events
        assert sum("OOMKilled" in e for e in events) >= 2, events
        assert "OOMKilled" in (verification.reason or ""), verification.reason
        assert store.verdicts(verification_id) == 0
        for attempt in (1, 2):
            (p,) = oom.pods(f"batch.kubernetes.io/job-name=convgate-{verification_id}-{attempt}")
            term = p["status"]["containerStatuses"][0]["state"]["terminated"]
            assert (term["reason"], term["exitCode"]) == ("OOMKilled", 137), term
        store.close()
    print(f"scenario 2 (OOM below gate 2, two attempts, failed): {time.monotonic() - t0:.1f}s")
