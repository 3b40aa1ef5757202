"""Verdict reuse through the API, on SQLite and on Postgres: a submission whose every input is pinned by
content (an hf:// source at a commit, the artifact by sha256), with the same policy hash and the same
verifier versions as an existing verdict, returns that verdict at once: a new verification marked
`reused_from`, no Job. `fresh: true` forces a run; a changed input, an unpinned source, another verifier
version or a run that ended without a verdict is never reused."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from engine.policy import Policy
from engine.verification import environment
from service.api.app import create_app, no_loops
from service.auth import Role
from service.config import KubernetesSettings, Settings
from service.dispatch.loop import DispatchLoop
from service.lifecycle import Reason, State
from service.persistence import repository
from service.persistence import reuse as reuse_store
from service.persistence.clock import as_utc
from service.persistence.db import transaction
from service.persistence.models import Verification
from tests.service.conftest import add_token, settings_for
from tests.service.test_lifecycle_loop import FakeDispatcher

SOURCE = "hf://org/model@" + "0" * 40
ARTIFACT = "hf://org/model-gguf@" + "1" * 40 + "/model-Q8_0.gguf"
SHA = "c" * 64
GOLDEN_KEY = "b248ce42fdf931b9fcfab6e38370ca3c30427804c4d90ec023c01d34774e17fa"


@pytest.fixture(params=["sqlite", "postgres"])
def api(request, tmp_path):
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")
    settings = settings_for(url, tmp_path, policies={"default": Policy(), "strict": Policy(version="strict-1")})
    app = create_app(settings, loops=no_loops)
    suffix = uuid.uuid4().hex[:6]
    with TestClient(app) as client:
        client.tokens = {who: add_token(url, Role.SUBMITTER, f"{who}-{suffix}") for who in ("one", "two")}
        client.tokens["admin"] = add_token(url, Role.ADMIN, f"admin-{suffix}")
        client.factory = app.state.session_factory
        client.settings = settings
        yield client


def body(**overrides: Any) -> dict[str, Any]:
    return {"source_uri": SOURCE, "artifact_uri": ARTIFACT, "artifact_sha256": SHA, **overrides}


def submit(api, who: str = "one", key: str | None = None, **overrides: Any):
    headers = {"Authorization": f"Bearer {api.tokens[who]}"} | ({"Idempotency-Key": key} if key else {})
    return api.post("/v1/verifications", json=body(**overrides), headers=headers)


def get(api, path: str, who: str = "one"):
    return api.get(path, headers={"Authorization": f"Bearer {api.tokens[who]}"})


def finish(api, verification_id: str, verdict: str = "GO", env: dict[str, str] | None = None) -> dict[str, Any]:
    """The verdict a worker with these versions (by default this service's own) would have stored."""
    report = {"verdict": verdict, "blockers": [] if verdict == "GO" else [
                  {"code": "tensor.value_mismatch", "gate": "storage", "why": "w", "tensor": "t", "text": None}],
              "gates": {"storage": {"name": "storage", "status": "passed", "seconds": 2.0, "details": {}}},
              "policy": {"values": {}, "sha256": "p" * 64}, "artifact": {"uri": ARTIFACT, "sha256": SHA, "size": 1},
              "files": [{"uri": ARTIFACT, "sha256": SHA, "size": 1}], "not_verified": [],
              "environment": environment() if env is None else env, "timings": {}}
    with transaction(api.factory) as session:
        attempt = repository.claim(session, verification_id, "test").attempt
        assert repository.start_attempt(session, verification_id, "test", attempt=attempt) is not None
        assert repository.record_verdict(session, verification_id, attempt, report, worker="test")
    return report


def launched(api) -> list[str]:
    """What a dispatch loop would start now."""
    loop = DispatchLoop(FakeDispatcher(), api.factory, api.settings)
    loop.tick()
    return [verification_id for verification_id, _ in loop.dispatcher.launched]


@pytest.mark.parametrize("verdict", ["GO", "NO-GO"])
def test_an_identical_pinned_submission_returns_the_verdict_at_once_without_a_job(api, verdict):
    original = submit(api).json()["id"]
    report = finish(api, original, verdict)
    response = submit(api)
    assert response.status_code == 202, response.text
    reused = response.json()
    assert reused["id"] != original and reused["reused_from"] == original
    assert (reused["state"], reused["verdict"], reused["attempt"], reused["failed_attempts"]) == (
        "completed", verdict, 0, 0)
    assert reused["finished_at"] is not None and reused["started_at"] is None
    assert launched(api) == []  # terminal: nothing to dispatch
    assert get(api, f"/v1/verifications/{reused['id']}/report").json()["verdict"] == report["verdict"]
    events = get(api, f"/v1/verifications/{reused['id']}/events").json()
    assert [(e["from_state"], e["to_state"]) for e in events] == [(None, "completed")]
    assert events[0]["message"] == (f"verdict {verdict} reused from {original} (same pinned inputs, policy and "
                                    "verifier; no Job)")
    assert events[0]["attempt"] == 0
    again = submit(api)  # reusing a reused verdict names the run that produced it
    assert again.json()["reused_from"] == original
    with transaction(api.factory) as session:
        stored = repository.verdict_for(session, reused["id"])
        assert stored is not None and stored.report == report and stored.verdict == verdict
        assert (stored.attempt, stored.blocker_codes) == (0, [] if verdict == "GO" else ["tensor.value_mismatch"])
        assert repository.events(session, reused["id"])[0].reason_code == Reason.VERDICT
        keys = {repository.get_verification(session, v).reuse_key for v in (original, reused["id"])}
        assert len(keys) == 1 and None not in keys


def test_another_submitters_identical_submission_is_measured_not_reused(api):
    """Before: submitter two got submitter one's verdict (`reused_from`), whose report and attestation name
    one's artifact URI, though a GET of one's verification is 404 for two. A verdict is now shared only
    with whoever may read the original; anyone else's submission runs."""
    original = submit(api).json()["id"]
    finish(api, original)
    response = submit(api, who="two")
    assert response.status_code == 202, response.text
    theirs = response.json()
    assert (theirs["state"], theirs["reused_from"], theirs["verdict"]) == ("queued", None, None)
    assert launched(api) == [theirs["id"]]
    assert get(api, f"/v1/verifications/{original}", who="two").status_code == 404


def test_a_principal_who_may_read_every_verdict_reuses_any(api):
    original = submit(api).json()["id"]
    finish(api, original)
    response = submit(api, who="admin")
    assert response.status_code == 202 and response.json()["reused_from"] == original


def test_fresh_forces_a_new_run(api):
    finish(api, submit(api).json()["id"])
    response = submit(api, fresh=True)
    assert response.status_code == 202
    fresh = response.json()
    assert (fresh["state"], fresh["reused_from"], fresh["verdict"]) == ("queued", None, None)
    assert launched(api) == [fresh["id"]]


@pytest.mark.parametrize("change", [
    {"artifact_sha256": "d" * 64},
    {"policy": "strict"},
    {"source_uri": "hf://org/model@" + "2" * 40},
    {"texts": ["another text"]},
    {"gates": [1]},
    {"kind": "embedding"},
], ids=["artifact", "policy", "source-commit", "texts", "gates", "kind"])
def test_a_changed_input_is_not_reused(api, change):
    finish(api, submit(api).json()["id"])
    changed = submit(api, **change).json()
    assert (changed["state"], changed["reused_from"]) == ("queued", None)
    assert launched(api) == [changed["id"]]


def test_another_verifier_version_is_not_reused(api):
    older = {**environment(), "transformers": "0.0.1"}
    finish(api, submit(api).json()["id"], env=older)
    assert submit(api).json()["reused_from"] is None
    finish(api, submit(api, fresh=True).json()["id"], env={})  # a report naming no versions proves none
    assert submit(api).json()["reused_from"] is None


def test_an_unpinned_input_is_never_reused(api, tmp_path):
    root = tmp_path / "models"
    settings = settings_for(api.settings.database_url, tmp_path, file_roots=(root,))
    with TestClient(create_app(settings, loops=no_loops)) as local:
        local.tokens, local.factory, local.settings = api.tokens, api.factory, settings
        unpinned = {"source_uri": (root / "m").as_uri()}
        finish(local, submit(local, **unpinned).json()["id"])
        assert submit(local, **unpinned).json()["reused_from"] is None  # a directory's content can change
        release = {"release_files": [(root / "README.md").as_uri()]}
        finish(local, submit(local, **release).json()["id"])
        assert submit(local, **release).json()["reused_from"] is None


def test_a_run_without_a_verdict_is_never_reused(api):
    failed = submit(api).json()["id"]
    with transaction(api.factory) as session:
        attempt = repository.claim(session, failed, "test").attempt
        assert repository.start_attempt(session, failed, "test", attempt=attempt) is not None
        assert repository.fail_permanently(session, failed, attempt, "source gone", worker="test")
    cancelled = submit(api, fresh=True).json()["id"]
    assert api.post(f"/v1/verifications/{cancelled}/cancel",
                    headers={"Authorization": f"Bearer {api.tokens['one']}"}).json()["state"] == "cancelled"
    retried = submit(api).json()
    assert (retried["state"], retried["reused_from"]) == ("queued", None)


def test_an_idempotent_retry_of_a_reused_submission_returns_the_same_row(api):
    finish(api, submit(api).json()["id"])
    first = submit(api, key="k-1")
    second = submit(api, key="k-1")
    assert (first.status_code, second.status_code) == (202, 200)
    assert second.json()["id"] == first.json()["id"] and second.json()["reused_from"] is not None
    assert submit(api, key="k-1", texts=["other"]).status_code == 409


def test_the_key_names_what_is_pinned_and_the_workers_that_would_run(tmp_path):
    from service.reuse import reuse_key

    local = Settings(database_url="sqlite://", cache_dir=tmp_path)
    request = {**body(), "gates": [1, 2, 3], "kind": "auto", "texts": None, "release_files": []}
    key = reuse_key(local, request, "p" * 64)
    assert key is not None and len(key) == 64
    # stored keys must stay valid across releases: this value changes only with a migration of reuse_key
    assert key == GOLDEN_KEY
    assert reuse_key(local, dict(reversed(request.items())), "p" * 64) == key  # not the order keys were sent in
    assert reuse_key(local, {**request, "artifact_uri": "https://mirror.example/m.gguf"}, "p" * 64) == key
    assert reuse_key(local, request, "q" * 64) != key
    assert reuse_key(local, {**request, "source_uri": "file:///models/m"}, "p" * 64) is None
    assert reuse_key(local, {**request, "release_files": ["file:///models/r"]}, "p" * 64) is None
    kube = local.model_copy(update={"dispatcher": "kubernetes"})
    other_image = kube.model_copy(update={"kubernetes": KubernetesSettings(image="convgate:9.9.9")})
    assert len({key, reuse_key(kube, request, "p" * 64), reuse_key(other_image, request, "p" * 64)}) == 3


def test_the_verifier_must_be_the_one_that_would_run_now(tmp_path):
    from service.reuse import same_verifier

    local = Settings(database_url="sqlite://", cache_dir=tmp_path)
    here = environment()
    assert same_verifier(local, here)
    assert same_verifier(local, {**here, "threads": "99"})  # a resource, not a version
    for name in ("convgate", "transformers", "llama-cpp-python", "gguf", "python"):
        assert not same_verifier(local, {**here, name: "0.0.0"}), name
    assert not same_verifier(local, {key: value for key, value in here.items() if key != "convgate"})
    assert not same_verifier(local, {}) and not same_verifier(local, None) and not same_verifier(local, ["convgate"])
    kube = local.model_copy(update={"dispatcher": "kubernetes"})
    assert same_verifier(kube, {**here, "transformers": "0.0.0"})  # the image (in the key) decides there
    assert not same_verifier(kube, {"transformers": "4"})
    none = local.model_copy(update={"dispatcher": "none"})
    assert reuse_key_for(none) is None


def reuse_key_for(settings: Settings) -> str | None:
    from service.reuse import reuse_key

    return reuse_key(settings, {**body(), "gates": [1, 2, 3], "kind": "auto", "texts": None, "release_files": []},
                     "p" * 64)


def test_of_several_matching_runs_the_newest_verdict_is_returned(api):
    older = submit(api).json()["id"]
    finish(api, older, "GO")
    newer = submit(api, fresh=True).json()["id"]
    finish(api, newer, "NO-GO")
    reused = submit(api).json()
    assert (reused["reused_from"], reused["verdict"]) == (newer, "NO-GO")


def test_a_split_is_keyed_on_every_shards_digest(tmp_path):
    from service.reuse import reuse_key

    local = Settings(database_url="sqlite://", cache_dir=tmp_path)
    request = {**body(), "gates": [1, 2, 3], "kind": "auto", "texts": None, "release_files": []}
    split = {**request, "artifact_shard_sha256": [request["artifact_sha256"], "b" * 64, "c" * 64]}
    other_third = {**split, "artifact_shard_sha256": [request["artifact_sha256"], "b" * 64, "d" * 64]}
    keys = {reuse_key(local, request, "p" * 64), reuse_key(local, split, "p" * 64),
            reuse_key(local, other_third, "p" * 64)}
    assert len(keys) == 3 and None not in keys


def test_only_a_completed_verifications_verdict_stands(api):
    """The lookup asks the state, not only for a verdict row: a verdict left on a verification that is no
    longer completed (an operator's repair, a future state) is not handed to anyone."""
    original = submit(api).json()["id"]
    finish(api, original)
    with transaction(api.factory) as session:
        session.execute(update(Verification).where(Verification.id == original).values(state=State.FAILED))
    assert submit(api).json()["reused_from"] is None


def test_the_lookup_reads_at_most_a_few_candidates(api):
    """The newest CANDIDATES runs with the key are read, no more: a key with many runs by other verifiers
    costs one bounded query, and a run older than those is not reached."""
    oldest = submit(api).json()["id"]
    finish(api, oldest)  # by this verifier: would stand, were it read
    for _ in range(reuse_store.CANDIDATES):
        finish(api, submit(api, fresh=True).json()["id"], env={**environment(), "transformers": "0.0.1"})
    assert submit(api).json()["reused_from"] is None


def test_the_reused_row_is_returned_as_it_was_written(api):
    original = submit(api).json()["id"]
    report = finish(api, original, "NO-GO")
    with transaction(api.factory) as session:
        key = repository.get_verification(session, original).reuse_key
        found = reuse_store.reusable(session, key, lambda _environment: True, submitted_by=None)
        assert found is not None and (found.original_id, found.verdict) == (original, "NO-GO")
        made = reuse_store.insert_reused(session, found, reuse_key=key, submitted_by="other", idempotency_key=None,
                                         request_sha256="r" * 64, request=body(), policy={}, policy_sha256="p" * 64,
                                         max_attempts=3)
        assert made is not None
        written = (made.id, made.state, made.attempt, made.failed_attempts, made.verdict_result, made.reused_from,
                   as_utc(made.created_at), as_utc(made.finished_at))
        assert written[1:6] == (State.COMPLETED, 0, 0, "NO-GO", original)
        session.expunge_all()
        stored = repository.get_verification(session, made.id)
        assert (stored.id, stored.state, stored.attempt, stored.failed_attempts, stored.verdict_result,
                stored.reused_from, as_utc(stored.created_at), as_utc(stored.finished_at)) == written
        verdict = repository.verdict_for(session, made.id)
        assert verdict is not None and (verdict.attempt, verdict.verdict, verdict.report) == (0, "NO-GO", report)
        assert as_utc(verdict.created_at) == as_utc(stored.created_at)
        (event,) = repository.events(session, made.id)
        assert (event.from_state, event.to_state, event.attempt) == (None, State.COMPLETED, 0)
