"""convgate's Kubernetes dispatcher on the real cluster: Jobs created with the chart's ServiceAccount
token (the chart's Role enforced), admitted, held and preempted by the real Kueue, run by the pod
runner as the real `convgate worker run`, verdicts and digests in the real Postgres.

Each test is one scenario of issue 9, in its own namespace and ClusterQueue; the cluster, the pod
runner and the database are shared by the session (the database is emptied per test).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.api.app import every_loop
from service.auth import Role
from service.config import Settings
from service.lifecycle import State
from service.persistence.clock import SYSTEM_CLOCK, Clock
from service.verifications import cancel
from tests.service.conftest import add_token, start_server

from .cluster import Cluster
from .convgate_env import AheadClock, Db, Replica, Scenario, held_worker, minilm_request, wait
from .pod_runner import PodRunner

pytestmark = pytest.mark.cluster
WORKER_TIMEOUT = 240  # one worker start + gate 1 on MiniLM Q8_0 takes ~10 s on 2 busy cores


@pytest.fixture
def scenarios(cluster: Cluster, pod_runner: PodRunner, pg: str, tmp_path: Any) -> Iterator[Any]:
    made: list[Scenario] = []
    grace, pod_runner.max_grace = pod_runner.max_grace, 3.0  # SIGKILL a SIGSTOPped worker soon after deletion

    def make(name: str, **kw: Any) -> Scenario:
        scenario = Scenario(cluster, f"{name}-{uuid.uuid4().hex[:5]}", pg, tmp_path, **kw).create()
        made.append(scenario)
        return scenario

    yield make
    pod_runner.oom_when, pod_runner.max_grace = None, grace
    for scenario in made:  # the namespace controller removes the Jobs; the pod runner stops their processes
        with contextlib.suppress(Exception):
            cluster.api.delete(f"/api/v1/namespaces/{scenario.namespace}")
            cluster.api.delete(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{scenario.namespace}")


@pytest.fixture
def replicas() -> Iterator[Any]:
    running: list[Replica] = []

    def start(settings: Settings, clock: Clock = SYSTEM_CLOCK) -> Replica:
        replica = Replica(settings, clock).start()
        running.append(replica)
        return replica

    yield start
    for replica in running:
        with contextlib.suppress(Exception):
            replica.stop()


@pytest.fixture
def db(pg: str) -> Iterator[Any]:
    opened: list[Db] = []

    def make(settings: Settings) -> Db:
        opened.append(Db(pg, settings))
        return opened[-1]

    yield make
    for each in opened:
        each.close()


def one_job_each(scenario: Scenario, ids: list[str], attempt: int = 1) -> None:
    for verification_id in ids:
        assert scenario.job_names(verification_id) == [f"convgate-{verification_id}-{attempt}"]


def completed_once(db: Db, verification_id: str) -> None:
    verification = db.get(verification_id)
    assert (verification.state, verification.verdict_result) == (State.COMPLETED, "GO"), db.events(verification_id)
    assert db.verdicts(verification_id) == 1
    digests = db.digests(verification_id)
    assert digests[minilm_request().artifact_uri] == minilm_request().artifact_sha256
    assert len(digests) > 5  # the artifact and every file of the source tree


# --- 1: one admitted, two pending, positions from the visibility API ----------------------------

def test_room_for_one_worker_three_submitted_through_the_api(scenarios, db, pod_runner) -> None:
    t0 = time.monotonic()
    scenario = scenarios("cg-queue")
    settings = scenario.settings()
    store = db(settings)
    submitter, operator = add_token(store.url, Role.SUBMITTER), add_token(store.url, Role.OPERATOR)
    body = minilm_request().model_dump(mode="json")
    with (contextlib.contextmanager(start_server)(settings, loops=every_loop) as server,
          httpx.Client(base_url=server.url, timeout=30, trust_env=False) as http):
        ids = [http.post("/v1/verifications", json=body, headers=server.headers(submitter)).json()["id"]
               for _ in range(3)]
        with held_worker(pod_runner, scenario.namespace, *ids, timeout=WORKER_TIMEOUT) as first:
            others = [i for i in ids if i != first]

            def queue() -> dict[str, Any]:
                return {item["id"]: item for item in http.get(
                    "/v1/queue", headers=server.headers(operator)).json()["active"]}

            def pending_with_positions() -> bool:
                items = queue()
                return sorted(items[i]["queue_position"] for i in others if items[i]["queue_position"] is not None
                              ) == [0, 1]

            wait("two pending with Kueue positions 0 and 1", pending_with_positions, timeout=60)
            items = queue()
            assert items[first]["cluster_status"] == "admitted" and items[first]["queue_position"] is None
            assert sorted(items[i]["queue_position"] for i in others) == [0, 1]
            assert {items[i]["cluster_status"] for i in others} == {"pending admission"}
            page = http.get("/ui/queue/table", headers=server.headers(operator)).text
            assert "pending admission #0" in page and "pending admission #1" in page
            suspended = {j["metadata"]["name"]: j["spec"]["suspend"] for j in scenario.jobs()}
            assert suspended == {f"convgate-{v}-1": v != first for v in ids}
        for verification_id in ids:
            store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=WORKER_TIMEOUT)
    for verification_id in ids:
        completed_once(store, verification_id)
    one_job_each(scenario, ids)
    print(f"scenario 1: {time.monotonic() - t0:.1f}s")


# --- 2: restart while two Jobs wait longer than the lease ----------------------------------------

def test_restart_while_jobs_wait_in_kueue_longer_than_the_lease(scenarios, db, replicas) -> None:
    t0 = time.monotonic()
    scenario = scenarios("cg-restart")
    settings = scenario.settings()
    store = db(settings)
    scenario.blocker("hold")  # takes the whole quota: convgate's Jobs wait
    first = replicas(settings)
    ids = [store.submit(), store.submit()]
    wait("both Jobs pending in Kueue", lambda: all(
        store.get(v).cluster_status == "pending admission" for v in ids), timeout=60)
    first.stop()
    # the restarted service, as if it came back later than the lease: both have waited longer than it
    restarted = replicas(settings, AheadClock(settings.lease_seconds + 2))
    restarted.wait_ticks(10)
    for verification_id in ids:
        verification = store.get(verification_id)
        assert (verification.state, verification.attempt, verification.failed_attempts) == (
            State.DISPATCHED, 1, 0), store.events(verification_id)
    one_job_each(scenario, ids)
    scenario.delete_job("hold")
    for verification_id in ids:
        store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=WORKER_TIMEOUT)
        completed_once(store, verification_id)
    one_job_each(scenario, ids)
    print(f"scenario 2: {time.monotonic() - t0:.1f}s")


# --- 3: two replicas dispatching at once -----------------------------------------------------------

def test_two_replicas_dispatch_at_once(scenarios, db, replicas) -> None:
    t0 = time.monotonic()
    scenario = scenarios("cg-replicas", cpu_quota="2")
    settings = scenario.settings()
    store = db(settings)
    ids = [store.submit() for _ in range(4)]
    replicas(settings)
    replicas(settings)
    for verification_id in ids:
        store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=2 * WORKER_TIMEOUT)
    for verification_id in ids:
        completed_once(store, verification_id)
        assert sum(e.startswith("dispatched to") for e in store.events(verification_id)) == 1
    one_job_each(scenario, ids)
    print(f"scenario 3: {time.monotonic() - t0:.1f}s")


# --- 4: preemption by a higher-priority workload ----------------------------------------------------

def test_preempted_verification_is_requeued_without_spending_an_attempt(scenarios, db, replicas,
                                                                          pod_runner) -> None:
    t0 = time.monotonic()
    scenario = scenarios("cg-preempt", preemption=True)
    settings = scenario.settings()
    store = db(settings)
    replicas(settings)
    verification_id = store.submit()
    store.wait_state(verification_id, State.RUNNING, timeout=WORKER_TIMEOUT)
    with held_worker(pod_runner, scenario.namespace, verification_id):
        scenario.blocker("urgent", seconds=4, priority="convgate-release")
        wait("the verification's Workload evicted", lambda: any(
            e.startswith("cluster: evicted") for e in store.events(verification_id)), timeout=60)
    verification = store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=WORKER_TIMEOUT)
    events = store.events(verification_id)
    completed_once(store, verification_id)
    assert "cluster: evicted: Preempted" in events, events
    assert (verification.attempt, verification.failed_attempts) == (1, 0), events  # the same attempt, re-admitted
    assert any(e.startswith("evicted: ") and e.endswith(": waiting for re-admission") for e in events), events
    one_job_each(scenario, [verification_id])  # the same Job, admitted again
    print(f"scenario 4: {time.monotonic() - t0:.1f}s")


def test_evicted_worker_is_replaced_without_spending_an_attempt(scenarios, db, replicas, pod_runner) -> None:
    """An eviction (the Eviction API, as a node drain sends it) marks the pod DisruptionTarget: the
    Job's podFailurePolicy ignores it and starts a new pod, which takes over the verification."""
    t0 = time.monotonic()
    scenario = scenarios("cg-evict")
    settings = scenario.settings()
    store = db(settings)
    replicas(settings)
    verification_id = store.submit()
    store.wait_state(verification_id, State.RUNNING, timeout=WORKER_TIMEOUT)
    job = f"convgate-{verification_id}-1"
    with held_worker(pod_runner, scenario.namespace, verification_id):
        (pod,) = scenario.api.get(f"/api/v1/namespaces/{scenario.namespace}/pods",
                                  params={"labelSelector": f"batch.kubernetes.io/job-name={job}"})["items"]
        name = pod["metadata"]["name"]
        scenario.api.post(f"/api/v1/namespaces/{scenario.namespace}/pods/{name}/eviction", {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": scenario.namespace}})
    verification = store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=WORKER_TIMEOUT)
    events = store.events(verification_id)
    completed_once(store, verification_id)
    # the Job's replacement pod took the same attempt over: no claim, no failure spent
    assert (verification.attempt, verification.failed_attempts) == (1, 0), events
    assert sum(f"attempt 1 taken over by {job}-" in e for e in events) == 1, events
    one_job_each(scenario, [verification_id])
    print(f"scenario 4b (eviction): {time.monotonic() - t0:.1f}s")


# --- 5: cancel while pending and while running ------------------------------------------------------

def test_cancel_while_pending_and_while_running(scenarios, db, replicas, pod_runner) -> None:
    t0 = time.monotonic()
    scenario = scenarios("cg-cancel")
    settings = scenario.settings()
    store = db(settings)
    replicas(settings)
    running = store.submit()
    store.wait_state(running, State.RUNNING, timeout=WORKER_TIMEOUT)
    with held_worker(pod_runner, scenario.namespace, running):
        pending = store.submit()
        # pending either way: Kueue may mark a workload it could not admit yet as Requeued (a CI run under load
        # saw the status stay away from "pending admission" for 60 s)
        wait("second Job pending", lambda: store.get(pending).cluster_status in ("pending admission", "requeued"),
             timeout=120)
        for verification_id in (pending, running):
            with store.factory() as session, session.begin():
                from service.persistence import repository

                verification = repository.get_verification(session, verification_id)
                assert verification is not None
                cancel(session, verification, "olga")
            wait(f"Job and Workload of {verification_id} gone", lambda v=verification_id: not scenario.job_names(v)
                 and not [w for w in scenario.workloads() if v in w["metadata"]["name"]], timeout=60)
    wait("the running worker's pod gone", lambda: not scenario.api.get(
        f"/api/v1/namespaces/{scenario.namespace}/pods")["items"], timeout=60)
    for verification_id in (pending, running):
        assert store.state(verification_id) == State.CANCELLED
        assert store.verdicts(verification_id) == 0
    print(f"scenario 5: {time.monotonic() - t0:.1f}s")


# --- 7: a Job deleted behind our back -------------------------------------------------------------

def test_job_deleted_behind_our_back_is_a_failed_attempt_and_retried(scenarios, db, replicas) -> None:
    t0 = time.monotonic()
    scenario = scenarios("cg-deleted")
    settings = scenario.settings()
    store = db(settings)
    scenario.blocker("hold")
    replicas(settings)
    verification_id = store.submit()
    wait("Job pending", lambda: store.get(verification_id).cluster_status == "pending admission", timeout=60)
    scenario.delete_job(f"convgate-{verification_id}-1")
    wait("a new attempt's Job", lambda: scenario.job_names(verification_id) == [f"convgate-{verification_id}-2"],
         timeout=60)
    verification = store.get(verification_id)
    assert verification.failed_attempts == 1
    assert f"its Job convgate-{verification_id}-1 was deleted outside convgate" in (verification.reason or "")
    scenario.delete_job("hold")
    store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=WORKER_TIMEOUT)
    completed_once(store, verification_id)
    print(f"scenario 7: {time.monotonic() - t0:.1f}s")


# --- 8: a worker that exits 1, one that is OOMKilled -----------------------------------------------

def test_crash_and_oom_are_counted_and_named(scenarios, db, replicas, pod_runner) -> None:
    t0 = time.monotonic()
    crashing = scenarios("cg-crash")
    crashing.set_database_url("postgresql+psycopg://convgate_test:wrong-password@127.0.0.1:5432/nowhere")
    settings = crashing.settings(max_attempts=2)
    store = db(settings)
    crashing_service = replicas(settings)
    crash = store.submit()
    failed = store.wait_state(crash, State.FAILED, State.COMPLETED, timeout=WORKER_TIMEOUT)
    events = store.events(crash)
    assert failed.state == State.FAILED and failed.failed_attempts == 2, events
    assert "worker exited with code 1" in (failed.reason or ""), failed.reason
    assert sum("worker exited with code 1" in e for e in events) == 2, events
    crashing_service.stop()  # one database: the next deployment's verifications are not its to take

    oom = scenarios("cg-oom")
    settings = oom.settings()
    store = db(settings)
    pod_runner.oom_when = lambda pod, container: pod["metadata"]["name"].startswith("convgate-") and (
        pod["metadata"]["labels"].get("convgate.io/attempt") == "1" and pod["metadata"]["namespace"] == oom.namespace)
    replicas(settings)
    killed = store.submit()
    store.wait_state(killed, State.COMPLETED, State.FAILED, timeout=2 * WORKER_TIMEOUT)
    verification, events = store.get(killed), store.events(killed)
    completed_once(store, killed)
    assert verification.failed_attempts == 1, events
    assert any("worker OOMKilled (exit code 137)" in e for e in events), events
    assert oom.job_names(killed) == [f"convgate-{killed}-1", f"convgate-{killed}-2"]
    print(f"scenario 8: {time.monotonic() - t0:.1f}s")


# --- 8b: least privilege: the worker holds only its restricted login and its attempt's secret ------

@pytest.fixture
def worker_login(pg: str) -> Iterator[str]:
    """A worker login that may only call the worker functions (`convgate db grant-worker`); its URL."""
    from tests.service.worker_roles import restricted_worker_login

    with restricted_worker_login(pg, "convgate_worker_c") as (made, _group):
        yield made.url


def test_a_restricted_worker_records_its_verdict_through_the_worker_functions(scenarios, db, replicas,
                                                                             worker_login) -> None:
    """With a worker database Secret the dispatcher creates the attempt's own Secret (the Role's
    `secrets: create`) and the Job never sees the service's database URL."""
    t0 = time.monotonic()
    scenario = scenarios("cg-restricted")
    scenario.api.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {
        "name": "convgate-worker-database", "namespace": scenario.namespace}, "stringData": {"url": worker_login}})
    settings = scenario.settings(kube={"worker_database_secret": "convgate-worker-database"})
    store = db(settings)
    replicas(settings)
    verification_id = store.submit()
    store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=WORKER_TIMEOUT)
    completed_once(store, verification_id)
    (job,) = scenario.jobs()
    secrets_used = {ref["name"] for container in job["spec"]["template"]["spec"]["containers"]
                    for env in container.get("env", []) for ref in [env.get("valueFrom", {}).get("secretKeyRef")]
                    if ref}
    assert "convgate-worker-database" in secrets_used and "convgate-database" not in secrets_used, secrets_used
    assert len(secrets_used) == 2, secrets_used  # the worker login and this attempt's own Secret
    one_job_each(scenario, [verification_id])
    print(f"scenario 8b (restricted worker): {time.monotonic() - t0:.1f}s")


# --- 9: gate 1 across pods: one Indexed Job, admitted whole, a killed shard retried alone -------------

INDEX = "batch.kubernetes.io/job-completion-index"
INDEX_FAILURES = "batch.kubernetes.io/job-index-failure-count"


def test_gate1_split_over_an_indexed_job_with_a_shard_killed_once(scenarios, db, replicas, pod_runner) -> None:
    """Issue 12 item 4 on the real cluster: MiniLM Q8_0 (~25 MiB) with 1 MiB per shard and at most 2 shards
    is one Indexed Job of 2 pods that Kueue admits as one workload of 2; shard 1's first pod is killed
    (OOMKilled, exit 137) and the Job controller retries index 1 alone; the verdict is written once, by
    the attempt the shards share, and no attempt is spent."""
    t0 = time.monotonic()
    scenario = scenarios("cg-shards", cpu_quota="2")
    settings = scenario.settings(lease_seconds=40.0, kube={"gate1_shard_bytes": 1 << 20, "max_gate1_shards": 2})
    store = db(settings)
    pod_runner.oom_when = lambda pod, container: pod["metadata"]["namespace"] == scenario.namespace and (
        pod["metadata"].get("annotations", {}).get(INDEX) == "1"
        and pod["metadata"].get("annotations", {}).get(INDEX_FAILURES, "0") == "0")
    replicas(settings)
    verification_id = store.submit()
    verification = store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=2 * WORKER_TIMEOUT)
    events = store.events(verification_id)
    completed_once(store, verification_id)
    assert (verification.attempt, verification.failed_attempts) == (1, 0), events
    (job,) = scenario.jobs()
    assert (job["spec"]["completionMode"], job["spec"]["completions"]) == ("Indexed", 2)
    (workload,) = scenario.workloads()
    assert [podset["count"] for podset in workload["spec"]["podSets"]] == [2]
    pods = scenario.api.get(f"/api/v1/namespaces/{scenario.namespace}/pods",
                            params={"labelSelector": f"batch.kubernetes.io/job-name={job['metadata']['name']}"})
    per_index: dict[str, int] = {}
    for pod in pods["items"]:
        per_index[pod["metadata"]["annotations"][INDEX]] = per_index.get(pod["metadata"]["annotations"][INDEX], 0) + 1
    assert per_index == {"0": 1, "1": 2}, per_index  # index 1 retried alone; index 0 ran once
    report = store.report(verification_id)
    assert report["gates"]["storage"]["details"]["shards"]["count"] == 2
    print(f"scenario 9 (gate 1 over 2 pods, one killed): {time.monotonic() - t0:.1f}s")


# --- 6: Kueue stopped (last: it restarts Kueue) -----------------------------------------------------

def test_kueue_down_keeps_verifications_queued_with_a_reason(cluster, scenarios, db, replicas) -> None:
    t0 = time.monotonic()
    scenario = scenarios("cg-kueue-down", cpu_quota="2")
    settings = scenario.settings()
    store = db(settings)
    replicas(settings)
    cluster.stop_kueue()
    try:
        ids = [store.submit(), store.submit()]

        def refused(verification_id: str) -> bool:
            verification = store.get(verification_id)
            return verification.state == State.QUEUED and "failed calling webhook" in (verification.reason or "")

        wait("both refused by Kueue's webhook", lambda: all(refused(v) for v in ids), timeout=60)
        for verification_id in ids:
            verification = store.get(verification_id)
            assert verification.cluster_status == "job not created: Kueue's admission webhook is unavailable"
            assert verification.attempt >= 1 and verification.failed_attempts == 0  # one claim per refused create
        assert scenario.jobs() == []
        from service.queue import snapshot as queue_snapshot

        with store.factory() as session:
            shown = {item.id: item for item in queue_snapshot(session, settings).active}
        assert all("failed calling webhook" in (shown[v].reason or "") for v in ids)
    finally:
        cluster.start_kueue()
    for verification_id in ids:
        store.wait_state(verification_id, State.COMPLETED, State.FAILED, timeout=WORKER_TIMEOUT)
        completed_once(store, verification_id)
        verification = store.get(verification_id)
        assert verification.failed_attempts == 0
        one_job_each(scenario, [verification_id], attempt=verification.attempt)  # refused creates made no Job
    print(f"scenario 6: {time.monotonic() - t0:.1f}s")
