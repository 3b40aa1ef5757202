"""The database enforces the rules: migrations up and down on Postgres and SQLite, models equal
to the migrations, one immutable verdict per verification, one idempotency key per submitter,
and attempts fenced so a stale attempt never overwrites a newer one."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from service.lifecycle import IllegalTransitionError, Reason, State, check_transition
from service.persistence import repository, tokens
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.migrate import downgrade, upgrade
from service.persistence.models import Base
from tests.service.seeding import seed

REQUEST = {"source_uri": "file:///m", "artifact_uri": "file:///m.gguf", "artifact_sha256": "a" * 64}
REPORT = {"verdict": "GO", "blockers": [], "gates": {"storage": {"status": "passed", "seconds": 1.0, "details": {}}},
          "files": [{"uri": "file:///m.gguf", "sha256": "a" * 64, "size": 3}]}


@pytest.fixture(params=["postgres", "sqlite"])
def url(request) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("pg")
    return request.getfixturevalue("sqlite_url")


@pytest.fixture
def factory(url):
    engine = make_engine(url)
    yield session_factory(engine)
    engine.dispose()


def new_verification(factory, key: str | None = None, submitter: str = "alice") -> str:
    with transaction(factory) as session:
        return seed(
            session, submitted_by=submitter, idempotency_key=key, request_sha256="r" * 64, request=REQUEST,
            policy={}, policy_sha256="p" * 64, max_attempts=3).id


def test_migrations_down_and_up_again(tmp_path, pg_url):
    for url in (f"sqlite:///{tmp_path / 'm.db'}", pg_url):
        upgrade(url)
        downgrade(url, "base")
        engine = make_engine(url)
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        engine.dispose()
        upgrade(url)
        engine = make_engine(url)
        assert {"verifications", "verdicts", "file_digests"} <= set(inspect(engine).get_table_names())
        engine.dispose()


def test_models_and_migrations_agree(url, factory):
    engine = factory.kw["bind"]
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata)
    assert diff == []


def start(factory, verification_id: str, worker: str) -> int:
    """What the dispatcher and the worker it launched do: claim the next attempt, start exactly it."""
    with transaction(factory) as session:
        attempt = repository.claim(session, verification_id, "dispatcher").attempt
        assert repository.start_attempt(session, verification_id, worker, attempt=attempt) is not None
    return attempt


def test_verdict_is_written_once_and_never_changed(factory):
    verification_id = new_verification(factory)
    attempt = start(factory, verification_id, "w")
    with transaction(factory) as session:
        assert repository.record_verdict(session, verification_id, attempt, REPORT, worker="w")
    with transaction(factory) as session:  # fenced: the verification is completed, nothing more is written
        assert not repository.record_verdict(session, verification_id, attempt, REPORT, worker="w")
    for statement in ("UPDATE verdicts SET verdict = 'NO-GO'", "DELETE FROM verdicts",
                      "UPDATE file_digests SET sha256 = 'x'", "DELETE FROM verification_events"):
        with pytest.raises(DBAPIError, match="immutable"), transaction(factory) as session:
            session.execute(text(statement))
    with pytest.raises(IntegrityError), transaction(factory) as session:  # a second verdict row
        session.execute(text("INSERT INTO verdicts (verification_id, attempt, verdict, blocker_codes, report, "
                             "created_at) VALUES (:id, 9, 'NO-GO', '[]', '{}', CURRENT_TIMESTAMP)"),
                        {"id": verification_id})
    with pytest.raises(IntegrityError), transaction(factory) as session:  # not a verdict value
        session.execute(text("INSERT INTO verdicts (verification_id, attempt, verdict, blocker_codes, report, "
                             "created_at) VALUES (:id, 9, 'MAYBE', '[]', '{}', CURRENT_TIMESTAMP)"),
                        {"id": new_verification(factory)})
    with factory() as session:
        assert session.scalar(text("SELECT count(*) FROM verdicts")) == 1
        assert session.scalar(text("SELECT verdict FROM verdicts")) == "GO"


def test_idempotency_key_is_unique_per_submitter(factory):
    new_verification(factory, key="k1")
    new_verification(factory, key="k1", submitter="bob")
    with transaction(factory) as session:  # the unique index refuses it; the insert yields, writing nothing
        assert repository.insert_unless_known(
            session, submitted_by="alice", idempotency_key="k1", request_sha256="r" * 64, request=REQUEST,
            policy={}, policy_sha256="p" * 64, max_attempts=3) is None


def test_stale_attempt_cannot_overwrite_a_newer_one(factory):
    verification_id = new_verification(factory)
    first = start(factory, verification_id, "w1")
    with transaction(factory) as session:  # the first worker is presumed dead, a second one starts
        repository.end_attempt_without_verdict(session, verification_id, first, Reason.HEARTBEAT_LOST, "lost")
    second = start(factory, verification_id, "w2")
    assert (first, second) == (1, 2)
    with transaction(factory) as session:
        assert not repository.heartbeat(session, verification_id, first, None, worker="w1")
        assert not repository.record_verdict(session, verification_id, first, REPORT | {"verdict": "NO-GO"},
                                             worker="w1")
        assert repository.record_verdict(session, verification_id, second, REPORT, worker="w2")
    with factory() as session:
        verdict = repository.verdict_for(session, verification_id)
        assert (verdict.attempt, verdict.verdict) == (2, "GO")


def test_attempts_run_out_then_fail_with_reason(factory):
    verification_id = new_verification(factory)
    for _ in range(3):
        attempt = start(factory, verification_id, "w")
        with transaction(factory) as session:
            repository.end_attempt_without_verdict(session, verification_id, attempt, Reason.WORKER_EXITED,
                                                   "killed by signal 9")
    with factory() as session:
        verification = repository.get_verification(session, verification_id)
        assert (verification.state, verification.attempt) == (State.FAILED, 3)
        assert "signal 9" in verification.reason
        with pytest.raises(IllegalTransitionError):
            check_transition(verification.state, State.RUNNING)


def test_tokens_are_found_by_digest_until_revoked(factory):
    with transaction(factory) as session:
        tokens.add_token(session, "ci", "submitter", "d" * 64)
        tokens.add_token(session, "ops", "operator", "e" * 64)
    with transaction(factory) as session:
        assert tokens.active_token(session, "d" * 64).name == "ci"
        assert [(t.name, t.role) for t in tokens.list_tokens(session)] == [("ci", "submitter"),
                                                                              ("ops", "operator")]
        assert tokens.revoke_token(session, "ci")
        assert not tokens.revoke_token(session, "ci")
        assert not tokens.revoke_token(session, "nobody")
    with factory() as session:
        assert tokens.active_token(session, "d" * 64) is None
        assert tokens.active_token(session, "e" * 64).role == "operator"
        assert tokens.list_tokens(session)[0].revoked_at is not None
