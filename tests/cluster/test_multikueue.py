"""MultiKueue (issue 36, item 3): convgate's API and dispatcher on a manager cluster, the verification
pods on a worker cluster's real node, two real control planes (tests/cluster/multikueue.py).

1. A verification submitted to the manager is admitted there (its ClusterQueue's MultiKueue check goes
   Ready), its Job is copied to the worker cluster and runs there on the real node in the worker image
   (the manager runs no pod: the Job is `managedBy: kueue.x-k8s.io/multikueue`), and its verdict reaches
   Postgres, once. Workers hold only the restricted worker login: the dispatcher creates each attempt's
   Secret in the worker cluster too (MultiKueue copies Jobs, not Secrets) and deletes it after, and the
   service's database URL never reaches the worker cluster.
2. The worker cluster goes away mid-run (its API server and Kueue stop, the running worker container is
   killed through the runtime): the manager sees the cluster lost, convgate re-dispatches the attempt (an
   eviction: same attempt, nothing counted) or counts it failed and starts another, and once the worker
   cluster is back the verification finishes with exactly one verdict. Never lost, never twice.

The service runs in-process on this machine (as in test_helm_chart.py: the manager has no node to run
the API pod on), with a TokenRequest token of the chart's ServiceAccount on the manager, so the chart's
Role is what the manager's API server enforces. Worker pods reach Postgres through `KubeNode.relay`.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.dispatch.kube.job_manifest import job_name
from service.lifecycle import State
from service.persistence.migrate import upgrade
from service.schemas import SubmitRequest
from tests.service.worker_roles import restricted_worker_login

from .cluster import Cluster
from .convgate_env import Db, Replica, Scenario, wait
from .multikueue import CHECK, MULTIKUEUE, MultiKueuePair, shipped
from .node import KubeNode
from .test_convgate_on_node import (  # noqa: F401 (images: a fixture)
    fresh_database,
    images,
    minilm,
    mount_model_store,
    sha256,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]
RUN_TIMEOUT = 900  # a worker start in the 5 GB image plus the gates, on 2 busy cores


@pytest.fixture(scope="module")
def manager(cluster: Cluster, tmp_path_factory: Any) -> Iterator[Cluster]:
    """The second control plane: etcd, kube-apiserver, kube-controller-manager, Kueue as MultiKueue manager."""
    t0 = time.monotonic()
    second = Cluster.start(cluster.bindir, tmp_path_factory.mktemp("manager"), multikueue=MULTIKUEUE)
    print(f"\nmanager cluster started in {time.monotonic() - t0:.1f}s")
    try:
        yield second
    finally:
        second.stop()


@pytest.fixture(scope="module")
def pair(manager: Cluster, cluster: Cluster, node: KubeNode, images: dict[str, str],  # noqa: F811
         tmp_path_factory: Any) -> Iterator[tuple[MultiKueuePair, Scenario, Replica, Path]]:
    """Both clusters set up as docs/kubernetes.md says, and one convgate dispatch loop on the manager."""
    workdir = tmp_path_factory.mktemp("multikueue")
    # the fixture files at one path for the in-process service (a symlink) and the worker pods (a mount of
    # the same directory): not under /root, which the worker image's uid 10001 cannot enter
    models = workdir / "models"
    models.symlink_to(minilm().resolve())
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(fresh_database())
        upgrade(url)  # the worker functions the restricted login may call come with the migrations
        login, _group = stack.enter_context(restricted_worker_login(url, "convgate_worker_mk"))
        namespace = node.namespace(f"mk-{uuid.uuid4().hex[:5]}")
        pair = MultiKueuePair(manager=manager, worker=cluster, node=node, namespace=namespace)
        relay_host, relay_port = node.relay(5432)
        pair.setup_worker(worker_database_url=login.url.replace("@127.0.0.1:5432/", f"@{relay_host}:{relay_port}/"),
                          database_port=relay_port)
        # the files at the same path in worker pods as here, so the URIs the in-process service admits are
        # the ones the pods read
        mount_model_store(cluster.api, namespace, minilm().resolve(), models)
        scenario = Scenario(manager, namespace, url, workdir).create()
        pair.setup_manager()
        base = scenario.settings(lease_seconds=60.0, poll_seconds=1.0, file_roots=(models,))
        settings = base.model_copy(update={"kubernetes": base.kubernetes.model_copy(update={
            "image": images["worker"], "image_pull_policy": "Never", "cpu_request": "500m", "cpu_limit": "2",
            "memory_request": "2Gi", "memory_limit": "3Gi", "ephemeral_storage_limit": "4Gi",
            "scratch_size_limit": "4Gi", "active_deadline_seconds": 1800,
            "worker_database_secret": "convgate-worker-database",
            "secret_mirrors": (pair.secret_mirror_kubeconfig(workdir / "worker-cluster.kubeconfig"),)})})
        replica = Replica(settings).start()
        try:
            yield pair, scenario, replica, models
        finally:
            replica.stop()
            with contextlib.suppress(Exception):
                cluster.api.delete(f"/api/v1/namespaces/{namespace}")
            with contextlib.suppress(Exception):
                cluster.api.delete(f"/api/v1/persistentvolumes/{namespace}-models")


def request(models: Path, gates: list[int]) -> SubmitRequest:
    artifact = models / "minilm-Q8_0.gguf"
    return SubmitRequest(source_uri=(models / "source").as_uri(), artifact_uri=artifact.as_uri(),
                         artifact_sha256=sha256(artifact), gates=gates)


def test_a_verification_submitted_to_the_manager_runs_on_the_worker_clusters_node(pair) -> None:
    mk, scenario, replica, models = pair
    t0 = time.monotonic()
    store = Db(scenario.database_url, replica.settings)
    verification_id = store.submit(request(models, [1]))
    seen: dict[str, dict[str, Any]] = {}
    checks: dict[str, str] = {}

    def finished() -> bool:
        mk.watch(verification_id, seen)
        for job in mk.jobs(mk.manager, verification_id):
            checks.update(mk.workload_checks(job))
        return store.state(verification_id) in (State.COMPLETED, State.FAILED)

    wait("the verification finished", finished, timeout=RUN_TIMEOUT, interval=0.5)
    assert store.state(verification_id) == State.COMPLETED, store.events(verification_id)
    print(f"submitted to the manager, GO from the worker cluster in {time.monotonic() - t0:.1f}s: {sorted(seen)}")

    (job,) = [obj for key, obj in seen.items() if key.startswith("manager job ")]
    assert job["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue"  # Kueue's webhook defaulted it
    assert checks.get(CHECK) == "Ready"  # admitted on the manager through the MultiKueue check
    assert not [key for key in seen if key.startswith("manager pod ")]  # nothing ran on the manager
    (remote,) = [obj for key, obj in seen.items() if key.startswith("worker job ")]
    assert remote["metadata"]["name"] == job["metadata"]["name"]
    assert remote["metadata"]["labels"].get("kueue.x-k8s.io/multikueue-origin")
    pods = [obj for key, obj in seen.items() if key.startswith("worker pod ")]
    assert pods and all(p["spec"].get("nodeName") == mk.node.name for p in pods), pods
    pod = pods[0]
    assert store.verdicts(verification_id) == 1
    assert store.report(verification_id)["verdict"] == "GO"
    assert store.digests(verification_id)
    # least privilege across clusters: the worker pod named only the restricted login and its attempt's
    # Secret, created in the worker cluster by the dispatcher (MultiKueue copies Jobs, not Secrets) and
    # deleted there once the Job finished; the service's database URL never reached the worker cluster
    named = {env["valueFrom"]["secretKeyRef"]["name"] for env in pod["spec"]["containers"][0]["env"]
             if "secretKeyRef" in env.get("valueFrom", {})}
    assert named == {"convgate-worker-database", f"{job['metadata']['name']}-attempt"}, named
    wait("the mirrored attempt Secret deleted in the worker cluster",
         lambda: f"{job['metadata']['name']}-attempt" not in mk.secret_names(mk.worker), timeout=60)
    assert "convgate-database" not in mk.secret_names(mk.worker)
    store.close()


def test_the_worker_cluster_going_away_mid_run_is_survived(pair) -> None:
    mk, scenario, replica, models = pair
    store = Db(scenario.database_url, replica.settings)
    verification_id = store.submit(request(models, [1, 2]))  # gate 2 keeps it running long enough to be cut off
    store.wait_state(verification_id, State.RUNNING, timeout=RUN_TIMEOUT)
    (pod,) = wait("the worker pod running in the worker cluster", lambda: [
        p for p in mk.pods(mk.worker, verification_id) if p.get("status", {}).get("phase") == "Running"],
        timeout=60)
    t0 = time.monotonic()
    mk.node.kill_container(mk.namespace, pod["metadata"]["name"], "worker")  # the run in progress is lost
    mk.worker_goes_away()
    try:
        wait("the manager sees the worker cluster lost", mk.worker_lost, timeout=120)
        wait("convgate takes the attempt back (re-dispatched or counted)",
             lambda: store.state(verification_id) in (State.DISPATCHED, State.QUEUED), timeout=300)
        print(f"worker cluster lost, attempt taken back in {time.monotonic() - t0:.1f}s: "
              f"{store.events(verification_id)[-3:]}")
    finally:
        mk.worker_comes_back()
    wait("the manager reaches the worker cluster again", mk.worker_active, timeout=120)
    seen: dict[str, dict[str, Any]] = {}

    def finished() -> bool:
        mk.watch(verification_id, seen)
        return store.state(verification_id) in (State.COMPLETED, State.FAILED)

    wait("the verification finished", finished, timeout=RUN_TIMEOUT, interval=0.5)
    done = store.get(verification_id)
    events = store.events(verification_id)
    assert done.state == State.COMPLETED, events
    assert store.verdicts(verification_id) == 1, events
    redispatched = any("waiting for re-admission" in e for e in events)
    counted = any(e.startswith("attempt 1 failed") for e in events)
    assert redispatched or counted, events
    assert done.failed_attempts == (1 if counted else 0), events
    final = job_name(verification_id, done.attempt)
    assert f"worker job {final}" in seen and f"manager job {final}" in seen, sorted(seen)
    assert [p for key, p in seen.items() if key.startswith(f"worker pod {final}")
            and p["spec"].get("nodeName") == mk.node.name], sorted(seen)  # the attempt that wrote the verdict
    print(f"survived: {'re-dispatched' if redispatched else 'counted and retried'}, "
          f"attempt {done.attempt}, {done.failed_attempts} failed, {time.monotonic() - t0:.1f}s after the loss")
    store.close()


def test_multikueue_manifests_are_what_the_clusters_run(pair) -> None:
    """The shipped manager and worker manifests are the ones the pair runs (not test-only objects)."""
    mk, _, _, _ = pair
    check = mk.manager.api.get(f"/apis/kueue.x-k8s.io/v1beta2/admissionchecks/{CHECK}")
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/multikueue"
    queue = mk.manager.api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{mk.namespace}")
    assert queue["spec"]["admissionChecksStrategy"]["admissionChecks"] == [{"name": CHECK}]
    kinds = {doc["kind"] for doc in shipped("manager.yaml", mk.namespace)}
    assert kinds == {"ClusterQueue", "AdmissionCheck", "MultiKueueConfig", "MultiKueueCluster"}
    role = mk.worker.api.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/convgate-multikueue-manager")
    assert {resource for rule in role["rules"] for resource in rule["resources"]} == {
        "jobs", "jobs/status", "workloads", "workloads/status", "clusterqueues", "localqueues"}
