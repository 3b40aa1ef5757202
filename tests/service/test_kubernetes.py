"""The Kubernetes dispatcher through the official client, at the HTTP boundary: the Job body,
idempotent and retried creates, Workload condition sequences mapped to states and events, the
visibility API path that actually goes out, cancel."""

from __future__ import annotations

import contextlib

import pytest
from kubernetes import client as k8s

from service.config import KubernetesSettings, Settings
from service.dispatch.kube.dispatcher import KubernetesDispatcher
from service.dispatch.kube.errors import KubeError
from service.dispatch.kube.job_manifest import ALLOWED_RESOURCES, build_job, job_name
from service.dispatch.loop import DispatchLoop
from service.lifecycle import State
from service.persistence import repository
from service.persistence.clock import ManualClock
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.fake_kube import FakeCluster, serve
from tests.service.seeding import seed

REQUEST = {"source_uri": "hf://org/m@" + "0" * 40, "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf",
           "artifact_sha256": "f" * 64}


@pytest.fixture
def cluster():
    fake = FakeCluster()
    for url in serve(fake):
        fake.url = url
        yield fake


def settings(tmp_path, url: str, **kube) -> Settings:
    return Settings(database_url=url, cache_dir=tmp_path / "c", dispatcher="kubernetes",
                    kubernetes=KubernetesSettings(in_cluster=False, api_timeout_seconds=1.0, retry_backoff_seconds=0.01,
                                                  priority_class="convgate-batch", **kube))


def dispatcher_for(cluster: FakeCluster, config: Settings) -> KubernetesDispatcher:
    configuration = k8s.Configuration(host=cluster.url)
    return KubernetesDispatcher(config, k8s.ApiClient(configuration))


@pytest.fixture
def harness(cluster, sqlite_url, tmp_path):
    config = settings(tmp_path, sqlite_url)
    engine = make_engine(sqlite_url)
    factory = session_factory(engine)
    loop = DispatchLoop(dispatcher_for(cluster, config), factory, config)
    yield loop, factory
    loop.dispatcher.shutdown()
    engine.dispose()


def new_verification(factory) -> str:
    with transaction(factory) as session:
        return seed(
            session, submitted_by="alice", idempotency_key=None, request_sha256="r" * 64, request=REQUEST,
            policy={}, policy_sha256="p" * 64, max_attempts=3).id


def state(factory, verification_id):
    with factory() as session:
        verification = repository.get_verification(session, verification_id)
        return verification, [e.message for e in repository.events(session, verification_id)]


def posts(cluster) -> list:
    return [r for r in cluster.requests if r.method == "POST"]


def test_job_body_is_suspended_cpu_only_restricted(tmp_path):
    config = settings(tmp_path, "sqlite://", node_selector={"convgate.io/pool": "cpu"})
    job = build_job(config, "0b3c2a9e-1111-4222-8333-444455556666", 2)
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"] == "convgate-0b3c2a9e-1111-4222-8333-444455556666-2" == job_name(
        "0b3c2a9e-1111-4222-8333-444455556666", 2)
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "convgate"
    assert meta["labels"]["kueue.x-k8s.io/priority-class"] == "convgate-batch"
    assert meta["labels"]["convgate.io/verification-id"] == "0b3c2a9e-1111-4222-8333-444455556666"
    assert spec["suspend"] is True
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (0, 21600, 3600)
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["command"][:5] == ["convgate", "worker", "run", "--verification-id", meta["labels"][
        "convgate.io/verification-id"]]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    for section in ("requests", "limits"):
        assert set(container["resources"][section]) == ALLOWED_RESOURCES  # never an accelerator
    assert pod["volumes"] == [{"name": "scratch", "emptyDir": {"sizeLimit": "40Gi"}}]
    database = next(e for e in container["env"] if e["name"] == "CONVGATE_DATABASE_URL")
    assert database["valueFrom"]["secretKeyRef"] == {"name": "convgate-database", "key": "url"}
    assert not any("value" in e and "postgres" in str(e["value"]) for e in container["env"])


def test_job_body_validates_against_the_kubernetes_schema(tmp_path):
    import kubernetes_validate

    job = build_job(settings(tmp_path, "sqlite://"), "0b3c2a9e-1111-4222-8333-444455556666", 1)
    kubernetes_validate.validate(job, "1.35.0", strict=True)
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert not set(job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]) <= ALLOWED_RESOURCES


def test_launch_creates_exactly_one_job_and_already_exists_is_success(harness, cluster):
    loop, factory = harness
    verification_id = new_verification(factory)
    loop.tick()
    name = job_name(verification_id, 1)
    assert list(cluster.jobs) == [name]
    (create,) = posts(cluster)
    assert create.path == "/apis/batch/v1/namespaces/convgate/jobs"
    assert create.body["spec"]["suspend"] is True
    loop.dispatcher.launch(verification_id, 1)  # a retried create after a lost answer
    assert list(cluster.jobs) == [name] and len(posts(cluster)) == 2
    assert state(factory, verification_id)[0].state == State.DISPATCHED


@pytest.mark.parametrize("fault", [500, 503, 2.0], ids=["500", "503", "timeout"])
def test_create_is_retried_after_a_server_error_or_timeout(harness, cluster, fault):
    loop, factory = harness
    cluster.create_faults = [fault]
    verification_id = new_verification(factory)
    loop.tick()
    assert list(cluster.jobs) == [job_name(verification_id, 1)]
    assert len(posts(cluster)) == 2
    assert state(factory, verification_id)[0].state == State.DISPATCHED


def test_create_refused_for_good_returns_the_verification_to_the_queue(harness, cluster):
    loop, factory = harness
    cluster.create_faults = [403]
    verification_id = new_verification(factory)
    loop.tick()
    verification, events = state(factory, verification_id)
    assert (verification.state, verification.attempt) == (State.QUEUED, 1)  # numbers are never given back
    assert "HTTP 403" in events[-1] and len(posts(cluster)) == 1
    with pytest.raises(KubeError) as info:
        cluster.create_faults = [422]
        loop.dispatcher.view.create_job(build_job(loop.settings, verification_id, 9))
    assert info.value.retryable is False


def run_worker(factory, verification_id: str, verdict: str = "GO") -> None:
    """What the Job's pod does once admitted: claim the attempt and record a verdict."""
    report = {"verdict": verdict, "blockers": [], "gates": {}, "files": []}
    with transaction(factory) as session:
        attempt = repository.get_verification(session, verification_id).attempt  # the one the claim assigned
        assert repository.start_attempt(session, verification_id, "pod", attempt=attempt) is not None
        assert repository.record_verdict(session, verification_id, attempt, report, worker="pod")


def test_admitted_then_finished(harness, cluster):
    loop, factory = harness
    verification_id = new_verification(factory)
    loop.tick()
    loop.tick()  # one poll while the Job waits for admission
    name = job_name(verification_id, 1)
    cluster.set_workload(name, ("QuotaReserved", "QuotaReserved"), ("Admitted", "Admitted"))
    loop.tick()
    assert state(factory, verification_id)[0].cluster_status == "admitted"
    run_worker(factory, verification_id)
    cluster.set_workload(name, ("Finished", "Succeeded"))
    cluster.set_job_condition(name, "Complete")
    loop.tick()
    verification, events = state(factory, verification_id)
    assert (verification.state, verification.verdict_result) == (State.COMPLETED, "GO")
    assert [e for e in events if e.startswith("cluster:")] == ["cluster: pending admission", "cluster: admitted",
                                                               "cluster: job complete"]


def test_evicted_then_requeued_then_admitted(harness, cluster):
    loop, factory = harness
    verification_id = new_verification(factory)
    loop.tick()
    loop.tick()
    name = job_name(verification_id, 1)
    for conditions in ([("Admitted", "Admitted")], [("Evicted", "Preempted")], [("Requeued", "Preempted")],
                       [("QuotaReserved", "QuotaReserved"), ("Admitted", "Admitted")]):
        cluster.set_workload(name, *conditions)
        loop.tick()
    verification, events = state(factory, verification_id)
    assert [e for e in events if e.startswith("cluster:")] == [
        "cluster: pending admission", "cluster: admitted", "cluster: evicted: Preempted", "cluster: requeued",
        "cluster: admitted"]
    assert verification.state == State.DISPATCHED and len(cluster.jobs) == 1  # the same Job, never a second


def test_never_admitted_shows_its_queue_position(harness, cluster, sqlite_url, tmp_path):
    loop, factory = harness
    ids = [new_verification(factory) for _ in range(3)]
    loop.tick()
    loop.tick()
    positions = [state(factory, v)[0].queue_position for v in ids]
    assert positions == [0, 1, 2]
    assert {state(factory, v)[0].cluster_status for v in ids} == {"pending admission"}
    from fastapi.testclient import TestClient

    from service.api.app import create_app, no_loops
    from service.auth import Role
    from tests.service.conftest import add_token

    token = add_token(sqlite_url, Role.OPERATOR)
    with TestClient(create_app(settings(tmp_path, sqlite_url), loops=no_loops)) as api:
        queue = api.get("/v1/queue", headers={"Authorization": f"Bearer {token}"}).json()
    assert sorted(item["queue_position"] for item in queue["active"]) == [0, 1, 2]
    assert queue["dispatcher"] == "kubernetes"


def test_visibility_path_goes_out_unescaped(harness, cluster):
    loop, _ = harness
    loop.dispatcher.view.pending_positions()
    visibility = [r.path for r in cluster.requests if "visibility" in r.path]
    assert visibility == ["/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/convgate/localqueues/convgate/"
                          "pendingworkloads"]
    # what the generic client would have sent: the subresource's slash escaped into the name
    custom = k8s.CustomObjectsApi(loop.dispatcher.api)
    with contextlib.suppress(k8s.ApiException):
        custom.get_namespaced_custom_object("visibility.kueue.x-k8s.io", "v1beta2", "convgate", "localqueues",
                                            "convgate/pendingworkloads")
    assert cluster.requests[-1].path.endswith("/localqueues/convgate%2Fpendingworkloads")


def test_cancel_deletes_the_job_in_the_background(harness, cluster):
    loop, factory = harness
    verification_id = new_verification(factory)
    loop.tick()
    from service.verifications import cancel

    with transaction(factory) as session:
        cancel(session, repository.get_verification(session, verification_id), "olga")
    loop.tick()
    (delete,) = [r for r in cluster.requests if r.method == "DELETE"]
    assert delete.path == f"/apis/batch/v1/namespaces/convgate/jobs/{job_name(verification_id, 1)}"
    assert delete.query["propagationPolicy"] == ["Background"]
    assert cluster.jobs == {}
    assert state(factory, verification_id)[0].state == State.CANCELLED


def running_first_attempt(harness, cluster, worker: str) -> tuple[str, str]:
    """A verification whose first attempt's Job was admitted and started by `worker` ({job}: the Job's name):
    its id and that Job's name."""
    loop, factory = harness
    verification_id = new_verification(factory)
    loop.tick()
    first = job_name(verification_id, 1)
    cluster.set_workload(first, ("Admitted", "Admitted"))
    with transaction(factory) as session:
        assert repository.start_attempt(session, verification_id, worker.format(job=first), attempt=1) is not None
    return verification_id, first


def test_failed_job_is_retried_as_a_new_attempt_with_a_new_job(harness, cluster):
    loop, factory = harness
    verification_id, first = running_first_attempt(harness, cluster, "pod")
    cluster.set_job_condition(first, "Failed", "DeadlineExceeded")
    loop.tick()
    loop.tick()
    verification, events = state(factory, verification_id)
    assert any("job failed: DeadlineExceeded" in e for e in events)
    assert job_name(verification_id, 2) in cluster.jobs and verification.state == State.DISPATCHED




def test_restarted_dispatcher_does_not_end_jobs_waiting_longer_than_the_lease(cluster, sqlite_url, tmp_path):
    """The regression the real cluster found (tests/cluster: restart while waiting), at the HTTP boundary."""
    config = settings(tmp_path, sqlite_url).model_copy(update={"lease_seconds": 0.3})
    engine = make_engine(sqlite_url)
    clock = ManualClock()
    factory = session_factory(engine, clock)
    first = DispatchLoop(dispatcher_for(cluster, config), factory, config)
    verification_id = new_verification(factory)
    first.tick()
    first.dispatcher.shutdown()
    clock.advance(2 * config.lease_seconds)  # the Job has waited in Kueue longer than the lease
    restarted = DispatchLoop(dispatcher_for(cluster, config), factory, config)
    restarted.tick()
    restarted.tick()
    restarted.dispatcher.shutdown()
    verification, events = state(factory, verification_id)
    assert (verification.state, verification.attempt, verification.failed_attempts) == (State.DISPATCHED, 1, 0)
    assert list(cluster.jobs) == [job_name(verification_id, 1)], events
    engine.dispose()


def test_a_preempted_worker_started_again_is_not_a_failed_attempt(sqlite_url):
    """`attempt` numbers claims (and fences writes); `failed_attempts` is what max_attempts limits. An
    eviction gives the same attempt back to the Job's next pod without counting a failure."""
    from service.lifecycle import Reason

    engine = make_engine(sqlite_url)
    factory = session_factory(engine)
    verification_id = new_verification(factory)
    with transaction(factory) as session:
        assert repository.claim(session, verification_id, "kubernetes:test").attempt == 1
        assert repository.start_attempt(session, verification_id, "convgate-x-1-aaaaa", attempt=1)
    with transaction(factory) as session:  # preempted: the dispatcher sees the eviction, the next pod takes over
        assert repository.release_evicted(session, verification_id, 1, "evicted: Preempted", "kubernetes:test")
        assert repository.start_attempt(session, verification_id, "convgate-x-1-bbbbb", attempt=1)
        assert not repository.heartbeat(session, verification_id, 1, None, worker="convgate-x-1-aaaaa")
    for number, expected in ((1, "queued"), (2, "queued"), (3, "failed")):
        with transaction(factory) as session:
            if number > 1:
                assert repository.claim(session, verification_id, "kubernetes:test").attempt == number
            assert repository.end_attempt_without_verdict(session, verification_id, number, Reason.JOB_LOST,
                                                          "crash") == expected
    verification, events = state(factory, verification_id)
    assert (verification.attempt, verification.failed_attempts, verification.max_attempts) == (3, 3, 3)
    assert "no attempts left" in events[-1]
    engine.dispose()


# --- item 6: permanent refusals are bounded; the visibility API is optional -------------------------

@pytest.mark.parametrize(("code", "reason", "says"), [
    (403, "Forbidden", "exceeded quota"), (422, "Invalid", "is invalid"), (400, "BadRequest", "denied the request")],
    ids=["403-quota", "422-invalid", "400-webhook-denied"])
def test_a_job_refused_for_good_fails_the_verification_after_a_bounded_number_of_tries(
        cluster, sqlite_url, tmp_path, code, reason, says):
    config = settings(tmp_path, sqlite_url, create_pause_seconds=0, refused_creates_before_failing=3)
    engine = make_engine(sqlite_url)
    factory = session_factory(engine)
    loop = DispatchLoop(dispatcher_for(cluster, config), factory, config)
    cluster.create_faults = [code] * 20
    verification_id = new_verification(factory)
    for _ in range(6):
        loop.tick()
    verification, events = state(factory, verification_id)
    loop.dispatcher.shutdown()
    engine.dispose()
    assert len(posts(cluster)) == 3, events  # exactly the bound, then never again
    assert verification.state == State.FAILED, events
    assert verification.failed_attempts == 0  # no worker ever ran
    assert f"HTTP {code}" in verification.reason and says in verification.reason
    assert verification.cluster_status == f"job refused: {reason}"
    assert "refused by the API server 3 times" in events[-1]


@pytest.mark.parametrize("faults", [[503] * 40, [429] * 40, [500, 429, 503, 502] * 10], ids=["503", "429", "mixed"])
def test_transient_refusals_keep_the_verification_queued_and_are_never_counted(cluster, sqlite_url, tmp_path,
                                                                               faults):
    config = settings(tmp_path, sqlite_url, create_pause_seconds=0, refused_creates_before_failing=1)
    engine = make_engine(sqlite_url)
    factory = session_factory(engine)
    loop = DispatchLoop(dispatcher_for(cluster, config), factory, config)
    cluster.create_faults = list(faults)
    verification_id = new_verification(factory)
    for _ in range(5):
        loop.tick()
    verification, events = state(factory, verification_id)
    assert verification.state == State.QUEUED and len(posts(cluster)) == 20, events  # 5 launches x 4 tries
    cluster.create_faults = []
    loop.tick()
    assert state(factory, verification_id)[0].state == State.DISPATCHED
    loop.dispatcher.shutdown()
    engine.dispose()


def test_one_permanent_refusal_then_success_is_not_counted_against_the_next_attempt(cluster, sqlite_url, tmp_path):
    config = settings(tmp_path, sqlite_url, create_pause_seconds=0, refused_creates_before_failing=2)
    engine = make_engine(sqlite_url)
    factory = session_factory(engine)
    loop = DispatchLoop(dispatcher_for(cluster, config), factory, config)
    cluster.create_faults = [403]
    verification_id = new_verification(factory)
    loop.tick()
    loop.tick()
    assert state(factory, verification_id)[0].state == State.DISPATCHED
    assert loop.dispatcher.refusals == {}  # forgotten once a create succeeded
    loop.dispatcher.shutdown()
    engine.dispose()


@pytest.mark.parametrize("fault", [503, 404, b"<html>proxy error</html>", b'{"items": 5}',
                                   b'{"items": [{"metadata": {"ownerReferences": [{"kind": "Job"}]}}]}',
                                   b'{"items": [{"positionInLocalQueue": "first", "metadata": '
                                   b'{"ownerReferences": [{"kind": "Job", '
                                   b'"name": "x"}]}}]}', 1.5],
                         ids=["503", "404-not-installed", "not-json", "items-not-a-list", "owner-without-name",
                              "position-not-a-number", "timeout"])
def test_a_failing_visibility_api_never_stops_dispatch(harness, cluster, fault):
    loop, factory = harness
    first = [new_verification(factory) for _ in range(2)]
    loop.tick()
    loop.tick()
    assert [state(factory, v)[0].queue_position for v in first] == [0, 1]
    cluster.visibility_fault = fault
    later = new_verification(factory)
    loop.tick()
    loop.tick()
    assert job_name(later, 1) in cluster.jobs  # dispatch went on
    assert [state(factory, v)[0].queue_position for v in [*first, later]] == [None, None, None]  # unknown
    assert loop.dispatcher.view.visibility_error
    cluster.visibility_fault = None
    loop.tick()
    assert [state(factory, v)[0].queue_position for v in [*first, later]] == [0, 1, 2]
    assert loop.dispatcher.view.visibility_error is None


# --- item 8: a worker Job holds only its own attempt's credential -------------------------------------

VID = "0b3c2a9e-1111-4222-8333-444455556666"


def test_a_restricted_worker_job_never_sees_the_control_planes_database_credential(tmp_path):
    import json

    from service.dispatch.kube.job_manifest import attempt_secret_name

    config = settings(tmp_path, "sqlite://", worker_database_secret="convgate-worker-database")
    job = build_job(config, VID, 3)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["CONVGATE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "convgate-worker-database",
                                                                         "key": "url"}
    assert env["CONVGATE_ATTEMPT_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": attempt_secret_name(VID, 3), "key": "secret", "optional": True}
    assert "convgate-database" not in json.dumps(job).replace("convgate-worker-database", "")


def restricted_harness(cluster, sqlite_url, tmp_path):
    config = settings(tmp_path, sqlite_url, worker_database_secret="convgate-worker-database")
    engine = make_engine(sqlite_url)
    return config, engine, session_factory(engine), dispatcher_for(cluster, config)


def claim_with_secret(factory, verification_id: str) -> tuple[int, str]:
    from service.persistence.attempt_secrets import issue_attempt_secret

    with transaction(factory) as session:
        attempt = repository.claim(session, verification_id, "kubernetes:test").attempt
        return attempt, issue_attempt_secret(session, verification_id, attempt)


def test_launch_hands_the_attempt_secret_to_its_own_job_only(cluster, sqlite_url, tmp_path):
    import base64
    import json

    from service.dispatch.kube.job_manifest import attempt_secret_name
    from service.persistence.attempt_secrets import secret_digest

    _, engine, factory, dispatcher = restricted_harness(cluster, sqlite_url, tmp_path)
    verification_id = new_verification(factory)
    attempt, secret = claim_with_secret(factory, verification_id)
    dispatcher.launch(verification_id, attempt, attempt_secret=secret)
    name = job_name(verification_id, attempt)
    (stored,) = cluster.secrets.values()
    assert stored["metadata"]["name"] == attempt_secret_name(verification_id, attempt)
    assert stored["metadata"]["ownerReferences"] == [{
        "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": cluster.jobs[name]["metadata"]["uid"],
        "blockOwnerDeletion": False}]  # garbage-collected with its Job
    assert stored["immutable"] is True and stored["type"] == "Opaque"
    assert base64.b64decode(stored["data"]["secret"]).decode() == secret
    assert secret not in json.dumps(cluster.jobs[name])  # a reader of Jobs and pods never sees it
    with factory() as session:
        assert repository.get_verification(session, verification_id).attempt_secret_sha256 == secret_digest(
            verification_id, attempt, secret)
    order = [r.path.rsplit("/", 1)[1] for r in cluster.requests if r.method == "POST"]
    assert order == ["jobs", "secrets"]  # the Job first: the Secret needs its uid
    dispatcher.shutdown()
    engine.dispose()


def test_a_retried_launch_finds_its_job_and_still_hands_over_the_secret(cluster, sqlite_url, tmp_path):
    config, engine, factory, dispatcher = restricted_harness(cluster, sqlite_url, tmp_path)
    verification_id = new_verification(factory)
    attempt, secret = claim_with_secret(factory, verification_id)
    cluster.create_job(build_job(config, verification_id, attempt))  # an earlier try whose answer was lost
    dispatcher.launch(verification_id, attempt, attempt_secret=secret)
    (stored,) = cluster.secrets.values()
    name = job_name(verification_id, attempt)
    assert stored["metadata"]["ownerReferences"][0]["uid"] == cluster.jobs[name]["metadata"]["uid"]
    dispatcher.launch(verification_id, attempt, attempt_secret=secret)  # the Secret exists too: done
    assert len(cluster.secrets) == 1
    dispatcher.shutdown()
    engine.dispose()


def test_a_restricted_launch_without_a_secret_is_refused_before_any_job(cluster, sqlite_url, tmp_path):
    from engine.errors import ConvgateError

    _, engine, factory, dispatcher = restricted_harness(cluster, sqlite_url, tmp_path)
    verification_id = new_verification(factory)
    with pytest.raises(ConvgateError, match="attempt secret"):
        dispatcher.launch(verification_id, 1)
    assert cluster.jobs == {} and cluster.secrets == {}
    dispatcher.shutdown()
    engine.dispose()


def test_a_sharded_attempt_is_one_indexed_job_whose_pods_share_a_worker_name(tmp_path):
    """Gate 1 split over 3 pods: one Indexed Job (Kueue admits its pods together), each index retried
    alone, every pod reporting under the Job's name so they run one attempt; valid for the API server."""
    import kubernetes_validate

    vid = "0b3c2a9e-1111-4222-8333-444455556666"
    job = build_job(settings(tmp_path, "sqlite://"), vid, 2, shards=3)
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (2, 0)
    assert "backoffLimit" not in spec  # it would count every index's failures together
    command = spec["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--worker-name") + 1] == job_name(vid, 2)
    assert spec["suspend"] is True
    kubernetes_validate.validate(job, "1.35.0", strict=True)
    single = build_job(settings(tmp_path, "sqlite://"), vid, 2)
    assert "completionMode" not in single["spec"] and single["spec"]["backoffLimit"] == 0
    assert "$(POD_NAME)" in single["spec"]["template"]["spec"]["containers"][0]["command"]


def test_a_failed_create_pauses_launches_for_the_pause_by_the_injected_clock(cluster, sqlite_url, tmp_path):
    """The pause after a failed create is read from the dispatcher's clock, like every other time the service
    compares: no capacity until the clock passes it, full capacity after, without waiting."""
    config = settings(tmp_path, sqlite_url, create_pause_seconds=30)
    clock = ManualClock()
    dispatcher = KubernetesDispatcher(config, k8s.ApiClient(k8s.Configuration(host=cluster.url)), clock=clock)
    cluster.create_faults = [422]  # refused: no retry inside launch
    with pytest.raises(KubeError):
        dispatcher.launch("a" * 32, 1)
    assert dispatcher.capacity() == 0
    clock.advance(29)
    assert dispatcher.capacity() == 0
    clock.advance(2)
    assert dispatcher.capacity() == config.kubernetes.max_jobs_in_flight
    dispatcher.shutdown()


def test_a_running_attempts_job_deleted_behind_our_back_is_a_failed_attempt(harness, cluster):
    """A RUNNING verification's Job is the one of the attempt its row holds, whose pod (<job name>-<suffix>)
    started it; gone from the cluster after it was seen, the attempt failed."""
    loop, factory = harness
    verification_id, first = running_first_attempt(harness, cluster, "{job}-x7k2p")
    loop.tick()
    del cluster.jobs[first]
    loop.tick()
    loop.tick()
    verification, _events = state(factory, verification_id)
    assert verification.failed_attempts == 1, verification.reason
    assert f"its Job {first} was deleted outside convgate" in (verification.reason or "")
