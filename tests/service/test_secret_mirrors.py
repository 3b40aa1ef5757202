"""MultiKueue copies Jobs, not Secrets (issue 36, item 3): with `secret_mirrors` the dispatcher creates
each restricted attempt's Secret in every worker cluster too (without the owner it has in the manager,
whose uid means nothing there), rolls the Job back when a worker cluster refuses it, and deletes the
copies when the attempt's Job finishes or is cancelled. Two fake API servers (tests/service/fake_kube.py)
play the manager and a worker cluster; tests/cluster/test_multikueue.py does it on two real ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from service.dispatch.kube.errors import KubeError
from service.dispatch.kube.job_manifest import attempt_secret_name, job_name
from service.dispatch.loop import DispatchLoop
from service.lifecycle import State
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.fake_kube import FakeCluster, serve
from tests.service.test_kubernetes import claim_with_secret, dispatcher_for, new_verification, run_worker, settings


@pytest.fixture
def worker_cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster()
    for url in serve(fake):
        fake.url = url
        yield fake


@pytest.fixture
def manager_cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster()
    for url in serve(fake):
        fake.url = url
        yield fake


def kubeconfig(path: Path, cluster: FakeCluster) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "w",
        "clusters": [{"name": "w", "cluster": {"server": cluster.url}}],
        "users": [{"name": "u", "user": {"token": "secret-mirror-token"}}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "u"}}]}))
    return path


@pytest.fixture
def mirrored(manager_cluster, worker_cluster, sqlite_url, tmp_path):
    config = settings(tmp_path, sqlite_url, worker_database_secret="convgate-worker-database",
                      secret_mirrors=(kubeconfig(tmp_path / "worker.kubeconfig", worker_cluster),))
    engine = make_engine(sqlite_url)
    factory = session_factory(engine)
    loop = DispatchLoop(dispatcher_for(manager_cluster, config), factory, config)
    yield loop, factory
    loop.dispatcher.shutdown()
    engine.dispose()


def test_the_attempt_secret_is_created_in_the_worker_cluster_without_an_owner(mirrored, manager_cluster,
                                                                              worker_cluster):
    loop, factory = mirrored
    verification_id = new_verification(factory)
    attempt, secret = claim_with_secret(factory, verification_id)
    loop.dispatcher.launch(verification_id, attempt, attempt_secret=secret)
    name = attempt_secret_name(verification_id, attempt)
    (local,) = manager_cluster.secrets.values()
    (copied,) = worker_cluster.secrets.values()
    assert local["metadata"]["name"] == copied["metadata"]["name"] == name
    assert local["metadata"]["ownerReferences"][0]["name"] == job_name(verification_id, attempt)
    assert "ownerReferences" not in copied["metadata"]
    assert copied["data"] == local["data"] and copied["immutable"] is True
    (request,) = [r for r in worker_cluster.requests if r.method == "POST"]
    assert request.path == "/api/v1/namespaces/convgate/secrets"  # the only call made there: no Jobs
    loop.dispatcher.launch(verification_id, attempt, attempt_secret=secret)  # a retried launch: AlreadyExists
    assert len(worker_cluster.secrets) == 1


def test_a_worker_cluster_that_refuses_the_secret_takes_the_job_back(mirrored, manager_cluster, worker_cluster):
    loop, factory = mirrored
    worker_cluster.namespace = "not-convgate"  # every call to the namespace is refused (404)
    verification_id = new_verification(factory)
    attempt, secret = claim_with_secret(factory, verification_id)
    with pytest.raises(KubeError):
        loop.dispatcher.launch(verification_id, attempt, attempt_secret=secret)
    assert manager_cluster.jobs == {}  # no pod may wait for a Secret that will never come


def test_the_copies_go_when_the_job_finishes_and_when_it_is_cancelled(mirrored, manager_cluster, worker_cluster):
    loop, factory = mirrored
    finished, cancelled = new_verification(factory), new_verification(factory)
    loop.tick()  # both claimed and launched, each with its Secret in both clusters
    assert set(worker_cluster.secrets) == {attempt_secret_name(finished, 1), attempt_secret_name(cancelled, 1)}
    run_worker(factory, finished)
    manager_cluster.set_job_condition(job_name(finished, 1), "Complete")
    loop.tick()
    assert set(worker_cluster.secrets) == {attempt_secret_name(cancelled, 1)}
    from service.verifications import cancel

    with transaction(factory) as session:
        cancel(session, repository.get_verification(session, cancelled), "olga")
    loop.tick()
    assert worker_cluster.secrets == {}
    with factory() as session:
        assert repository.get_verification(session, finished).state == State.COMPLETED
