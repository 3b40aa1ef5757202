"""Item 8: a worker's database credential records its own attempt and nothing else, on real Postgres.

The login made by `worker_role` (a NOLOGIN group holding EXECUTE on the worker functions, a login in
it) plus a per-attempt secret tries to write another verification's verdict, read every table, update
a finished verification, replay an older attempt's secret and heartbeat someone else's attempt: all
refused, nothing written. The honest path (start, heartbeat, verdict) ends as a verdict the
repository shows. Needs a test role with CREATEROLE (roles are created per run and dropped)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import ProgrammingError
from typer.testing import CliRunner

from service.cli import app as cli_app
from service.dispatch.base import WorkerExit
from service.dispatch.loop import DispatchLoop
from service.lifecycle import Reason, State
from service.persistence import repository, tokens
from service.persistence.attempt_contract import ATTEMPT_SECRET_ENV
from service.persistence.attempt_secrets import AttemptNotClaimedError, issue_attempt_secret, secret_digest
from service.persistence.db import make_engine, session_factory, transaction
from service.persistence.restricted_channel import RestrictedChannel
from service.persistence.worker_channel import DirectChannel, channel_for
from service.persistence.worker_reports import apply_worker_reports
from service.persistence.worker_role import (
    WORKER_FUNCTIONS,
    WorkerRoleError,
    check_least_privilege,
)
from tests.conftest import fixtures_root
from tests.service.conftest import PG_ADMIN, settings_for
from tests.service.seeding import seed
from tests.service.worker_roles import restricted_worker_login

REQUEST = {"source_uri": "hf://org/m@" + "0" * 40, "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf",
           "artifact_sha256": "f" * 64}
TABLES = ("api_tokens", "verifications", "verification_events", "verdicts", "gate_results", "tensor_rows",
          "file_digests", "worker_reports", "alembic_version")


def report(verdict: str = "GO") -> dict:
    tensor = {"gguf_name": "token_embd.weight", "source_names": ["embeddings.word_embeddings.weight"],
              "transform": None, "gguf_type": "F32", "source_dtype": "F32", "shape": [8, 4], "check": "bit-exact",
              "max_abs": 0.0, "rel_l2": 0.0, "mismatched": 0, "result": "ok"}
    return {"verdict": verdict, "blockers": [], "policy": {}, "artifact": None, "not_verified": [],
            "environment": {}, "timings": {},
            "gates": {"storage": {"name": "storage", "status": "passed", "seconds": 0.5,
                                  "details": {"tensors": [tensor]}}},
            "files": [{"uri": "file:///m.gguf", "sha256": "f" * 64, "size": 123}]}


@dataclass
class Worker:
    """The restricted credential: a URL that logs in as the worker role."""

    url: str
    group: str
    engine: Engine

    def call(self, sql: str, **params):
        with self.engine.begin() as connection:
            return connection.execute(text(sql), params).scalar()


@pytest.fixture(scope="module")
def worker_login(pg_url: str) -> Iterator[Worker]:
    with psycopg.connect(PG_ADMIN) as admin:
        may_create_roles = admin.execute("SELECT rolcreaterole OR rolsuper FROM pg_roles "
                                         "WHERE rolname = current_user").fetchone()
    assert may_create_roles and may_create_roles[0], "the test role needs CREATEROLE (dev.py ensure_postgres)"
    with restricted_worker_login(pg_url, "convgate_worker_t") as (made, group):
        engine = make_engine(made.url)
        yield Worker(made.url, group, engine)
        engine.dispose()


@pytest.fixture
def factory(pg):
    engine = make_engine(pg)
    yield session_factory(engine)
    engine.dispose()


def submitted(factory) -> str:
    with transaction(factory) as session:
        return seed(
            session, submitted_by="alice", idempotency_key=None, request_sha256="r" * 64, request=REQUEST,
            policy={"min_cosine": 0.99}, policy_sha256="p" * 64, max_attempts=3).id


def claimed(factory, verification_id: str) -> tuple[int, str]:
    """What the dispatch loop does when it claims: assign the attempt, issue its secret (one transaction)."""
    with transaction(factory) as session:
        verification = repository.claim(session, verification_id, "kubernetes:test")
        assert verification is not None
        return verification.attempt, issue_attempt_secret(session, verification_id, verification.attempt)


def row(factory, verification_id: str):
    with factory() as session:
        return repository.get_verification(session, verification_id)


def reports_of(factory, verification_id: str) -> list[tuple]:
    with factory() as session:
        return list(session.execute(text("SELECT kind, attempt, worker, outcome FROM worker_reports "
                                          "WHERE verification_id = :v ORDER BY id"), {"v": verification_id}))


class ControlPlane:
    """The dispatch loop's part, in a thread: apply worker reports every few milliseconds."""

    def __init__(self, factory) -> None:
        self.factory, self.stop = factory, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            with transaction(self.factory) as session:
                apply_worker_reports(session)

    def __enter__(self) -> ControlPlane:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def restricted(worker: Worker, verification_id: str, attempt: int, secret: str, name: str = "pod-a"):
    return RestrictedChannel(worker.engine, verification_id, attempt, name, secret, wait_seconds=10,
                             poll_seconds=0.02)


def claimed_channel(worker: Worker, factory) -> tuple[str, RestrictedChannel]:
    """A submitted verification, claimed by the loop, and the restricted channel its worker gets."""
    verification_id = submitted(factory)
    attempt, secret = claimed(factory, verification_id)
    return verification_id, restricted(worker, verification_id, attempt, secret)


def test_the_honest_path_is_recorded_and_visible_through_the_repository(worker_login, factory):
    verification_id = submitted(factory)
    attempt, secret = claimed(factory, verification_id)
    channel = restricted(worker_login, verification_id, attempt, secret)
    with ControlPlane(factory):
        started = channel.start()
        assert started is not None
        assert started.request == REQUEST and started.policy == {"min_cosine": 0.99}
        assert channel.heartbeat({"stage": "gate 1", "done": 1, "total": 3})
        assert channel.record_verdict(report("GO"))
    verification = row(factory, verification_id)
    assert (verification.state, verification.verdict_result, verification.worker) == (State.COMPLETED, "GO", "pod-a")
    with factory() as session:
        verdict = repository.verdict_for(session, verification_id)
        assert verdict is not None and verdict.attempt == attempt and verdict.report["files"][0]["size"] == 123
        messages = [e.message for e in repository.events(session, verification_id)]
    assert any("started by pod-a" in m for m in messages) and any("verdict GO" in m for m in messages)
    assert [(k, o) for k, _, _, o in reports_of(factory, verification_id)] == [
        ("start", "accepted"), ("heartbeat", "accepted"), ("verdict", "accepted")]


def test_a_heartbeat_moves_the_lease_and_the_progress(worker_login, factory):
    verification_id, channel = claimed_channel(worker_login, factory)
    with ControlPlane(factory):
        assert channel.start() is not None
    before = row(factory, verification_id).heartbeat_at
    assert channel.heartbeat({"stage": "gate 2", "done": 2, "total": 5})
    with transaction(factory) as session:
        assert apply_worker_reports(session) == 1
    after = row(factory, verification_id)
    assert after.heartbeat_at > before and after.progress == {"stage": "gate 2", "done": 2, "total": 5}


def test_a_worker_that_ends_without_a_verdict_is_retried(worker_login, factory):
    verification_id, channel = claimed_channel(worker_login, factory)
    with ControlPlane(factory):
        assert channel.start() is not None
        channel.end_without_verdict("RuntimeError: boom")
    verification = row(factory, verification_id)
    assert (verification.state, verification.failed_attempts) == (State.QUEUED, 1)
    assert "boom" in verification.reason


def test_a_worker_may_not_write_another_verifications_verdict(worker_login, factory):
    mine, other = submitted(factory), submitted(factory)
    attempt, secret = claimed(factory, mine)
    other_attempt, _ = claimed(factory, other)
    for target, number in ((other, other_attempt), (other, attempt)):
        assert worker_login.call("SELECT convgate_worker_record_verdict(:v, :a, :s, 'pod-a', CAST(:r AS jsonb))",
                                 v=target, a=number, s=secret, r='{"verdict": "GO"}') is False
        assert worker_login.call("SELECT convgate_worker_start(:v, :a, :s, 'pod-a')",
                                 v=target, a=number, s=secret) is None
    assert reports_of(factory, other) == []
    with transaction(factory) as session:
        apply_worker_reports(session)
    assert row(factory, other).state == State.DISPATCHED and row(factory, other).verdict_result is None


def test_a_worker_reads_and_writes_no_table_at_all(worker_login, factory):
    with factory() as session:
        tables = set(session.scalars(text("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")))
    assert set(TABLES) <= tables
    for table in sorted(tables):
        for statement in (f"SELECT count(*) FROM {table}", f"DELETE FROM {table}",
                          f"INSERT INTO {table} DEFAULT VALUES", f"TRUNCATE {table}"):
            with pytest.raises(ProgrammingError) as info:
                worker_login.call(statement)
            assert isinstance(info.value.orig, psycopg.errors.InsufficientPrivilege), statement


def test_a_worker_may_not_read_tokens_or_call_the_internal_functions(worker_login, factory):
    with transaction(factory) as session:
        tokens.add_token(session, "pipeline", "submitter", "d" * 64)
    for statement in ("SELECT token_sha256 FROM api_tokens",
                      "SELECT * FROM convgate_worker_authenticated('x', 1, repeat('s', 40))",
                      "SELECT convgate_worker_submit('x', 1, repeat('s', 40), 'w', 'verdict', '{}'::jsonb)",
                      "INSERT INTO worker_reports (verification_id, attempt, kind, worker, payload, reported_at) "
                      "VALUES ('x', 1, 'verdict', 'w', '{}', now())",
                      "CREATE TABLE mine (x int)"):
        with pytest.raises(ProgrammingError) as info:
            worker_login.call(statement)
        assert isinstance(info.value.orig, psycopg.errors.InsufficientPrivilege), statement


def test_a_finished_verification_cannot_be_updated(worker_login, factory):
    verification_id = submitted(factory)
    attempt, secret = claimed(factory, verification_id)
    channel = restricted(worker_login, verification_id, attempt, secret)
    with ControlPlane(factory):
        assert channel.start() is not None
        assert channel.record_verdict(report("NO-GO"))
    assert channel.heartbeat({"stage": "x", "done": 0, "total": 1}) is False
    assert channel.record_verdict(report("GO")) is False
    assert channel.start() is None
    assert worker_login.call("SELECT convgate_worker_end(:v, :a, :s, 'pod-b', 'x', true)",
                             v=verification_id, a=attempt, s=secret) is False
    with transaction(factory) as session:
        assert apply_worker_reports(session) == 0
    verification = row(factory, verification_id)
    assert (verification.state, verification.verdict_result) == (State.COMPLETED, "NO-GO")


def test_an_older_attempts_secret_is_refused_once_a_newer_attempt_is_claimed(worker_login, factory):
    verification_id = submitted(factory)
    first, old_secret = claimed(factory, verification_id)
    with transaction(factory) as session:  # the first Job was lost; the dispatcher retries
        repository.end_attempt_without_verdict(session, verification_id, first, Reason.JOB_LOST, "lost")
    second, new_secret = claimed(factory, verification_id)
    assert second == first + 1
    for attempt in (first, second):
        late = restricted(worker_login, verification_id, attempt, old_secret, name="late-pod")
        assert late.start() is None
        assert late.heartbeat(None) is False
        assert worker_login.call("SELECT convgate_worker_record_verdict(:v, :a, :s, 'late-pod', CAST(:r AS jsonb))",
                                 v=verification_id, a=attempt, s=old_secret, r="{}") is False
    assert restricted(worker_login, verification_id, first, new_secret).heartbeat(None) is False  # bound to 2
    assert reports_of(factory, verification_id) == []
    assert row(factory, verification_id).attempt_secret_sha256 == secret_digest(verification_id, second, new_secret)


def test_a_worker_may_not_heartbeat_someone_elses_attempt(worker_login, factory):
    mine, theirs = submitted(factory), submitted(factory)
    attempt, secret = claimed(factory, mine)
    their_attempt, _ = claimed(factory, theirs)
    with transaction(factory) as session:
        assert repository.start_attempt(session, theirs, "their-pod", attempt=their_attempt) is not None
    before = row(factory, theirs).heartbeat_at
    for worker in ("pod-a", "their-pod"):
        assert worker_login.call(
            "SELECT convgate_worker_heartbeat(:v, :a, :s, :w, CAST(:p AS jsonb))",
            v=theirs, a=their_attempt, s=secret, w=worker, p='{"stage": "evil"}') is False
    with transaction(factory) as session:
        apply_worker_reports(session)
    assert row(factory, theirs).heartbeat_at == before and row(factory, theirs).progress is None
    assert attempt  # mine stays untouched too
    assert reports_of(factory, theirs) == [] and reports_of(factory, mine) == []


def test_a_malformed_verdict_is_marked_invalid_and_changes_nothing(worker_login, factory):
    verification_id, channel = claimed_channel(worker_login, factory)
    with ControlPlane(factory):
        assert channel.start() is not None
        assert channel.record_verdict({"verdict": "GO", "blockers": "none"}) is False
    assert row(factory, verification_id).state == State.RUNNING
    assert reports_of(factory, verification_id)[-1][3] == "invalid"


def test_an_oversized_heartbeat_is_refused(worker_login, factory):
    _, channel = claimed_channel(worker_login, factory)
    assert channel.heartbeat({"stage": "x" * 10_000}) is False
    assert channel.heartbeat({"stage": "x"}) is True


def test_without_the_group_the_functions_cannot_be_called(worker_login, factory, pg):
    """EXECUTE is revoked from PUBLIC: a login outside the group gets nothing."""
    outsider = f"convgate_outsider_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {outsider} LOGIN PASSWORD 'outsider-only-for-this-test'")
    try:
        from sqlalchemy.engine import make_url

        engine = make_engine(make_url(pg).set(username=outsider, password="outsider-only-for-this-test")
                             .render_as_string(hide_password=False))
        with pytest.raises(ProgrammingError) as info, engine.begin() as connection:
            connection.execute(text("SELECT convgate_worker_start('x', 1, repeat('s', 40), 'w')"))
        assert isinstance(info.value.orig, psycopg.errors.InsufficientPrivilege)
        engine.dispose()
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {outsider}")


def test_the_least_privilege_check_notices_a_table_grant(worker_login, pg):
    owner = make_engine(pg)
    with owner.begin() as connection:
        check_least_privilege(connection, worker_login.group)
        connection.execute(text(f"GRANT SELECT ON api_tokens TO {worker_login.group}"))
        with pytest.raises(WorkerRoleError, match="api_tokens"):
            check_least_privilege(connection, worker_login.group)
        connection.execute(text(f"REVOKE SELECT ON api_tokens FROM {worker_login.group}"))
    owner.dispose()


def test_a_secret_is_issued_only_for_a_dispatched_verification(factory):
    verification_id = submitted(factory)
    with transaction(factory) as session, pytest.raises(AttemptNotClaimedError):
        issue_attempt_secret(session, verification_id, 1)
    attempt, secret = claimed(factory, verification_id)
    stored = row(factory, verification_id).attempt_secret_sha256
    assert stored == secret_digest(verification_id, attempt, secret) and secret not in stored
    assert len(secret) >= 43


@pytest.mark.parametrize("database", ["pg", "sqlite_url"])
def test_the_local_pool_keeps_the_direct_path(request, database):
    url = request.getfixturevalue(database)
    engine = make_engine(url)
    local = session_factory(engine)
    verification_id = submitted(local)
    with transaction(local) as session:
        attempt = repository.claim(session, verification_id, "local:test").attempt
    channel = channel_for(url, verification_id, attempt, "local-worker", environ={})
    assert isinstance(channel, DirectChannel)
    assert channel.start() is not None and channel.heartbeat({"stage": "s", "done": 0, "total": 1})
    assert channel.record_verdict(report("GO"))
    channel.close()
    assert row(local, verification_id).verdict_result == "GO"
    other = channel_for(url, verification_id, attempt, "w", environ={"CONVGATE_ATTEMPT_SECRET": "s"})
    assert isinstance(other, RestrictedChannel)
    other.close()
    engine.dispose()


# --- the wiring: the dispatch loop issues each attempt's secret and applies what workers report ------

class RecordingDispatcher:
    """A dispatcher double that keeps what `launch` was handed (as a Kubernetes Job's Secret would)."""

    name = "recording"
    identity = "recording:1"

    def __init__(self) -> None:
        self.launched: list[tuple[str, int, str | None]] = []
        self.exits: list[WorkerExit] = []

    def capacity(self) -> int:
        return 4

    def launch(self, verification_id: str, attempt: int, attempt_secret: str | None = None,
               shards: int = 1) -> None:
        self.launched.append((verification_id, attempt, attempt_secret))

    def reap(self) -> list[WorkerExit]:
        exits, self.exits = self.exits, []
        return exits

    def active(self) -> set[str]:
        return {verification_id for verification_id, _, _ in self.launched}

    def cancel(self, verification_id: str) -> None:
        """Nothing runs."""

    def owns_dead(self, worker: str | None) -> bool:
        return False

    def sync(self, session) -> None:
        """No cluster."""

    def shutdown(self) -> None:
        """Nothing to stop."""


def test_the_loop_issues_each_claimed_attempt_its_own_secret(factory, tmp_path):
    first, second = submitted(factory), submitted(factory)
    dispatcher = RecordingDispatcher()
    DispatchLoop(dispatcher, factory, settings_for(factory.kw["bind"].url.render_as_string(False), tmp_path)).tick()
    assert sorted((v, a) for v, a, _ in dispatcher.launched) == sorted([(first, 1), (second, 1)])
    for verification_id, attempt, secret in dispatcher.launched:
        assert secret is not None
        assert row(factory, verification_id).attempt_secret_sha256 == secret_digest(verification_id, attempt, secret)
    assert dispatcher.launched[0][2] != dispatcher.launched[1][2]


def test_the_loop_applies_a_verdict_report_before_it_reaps_the_clean_exit(worker_login, factory, tmp_path):
    """A restricted worker files its verdict and exits 0: the next tick must store the verdict, not
    count the exit as an attempt that ended without one."""
    verification_id = submitted(factory)
    dispatcher = RecordingDispatcher()
    loop = DispatchLoop(dispatcher, factory, settings_for(factory.kw["bind"].url.render_as_string(False), tmp_path))
    loop.tick()
    ((_, attempt, secret),) = dispatcher.launched
    channel = RestrictedChannel(worker_login.engine, verification_id, attempt, "pod-a", secret, wait_seconds=0)
    channel.start()  # filed; accepted at the next tick
    loop.tick()
    assert row(factory, verification_id).state == State.RUNNING
    channel.record_verdict(report("NO-GO"))  # filed, not waited for
    dispatcher.exits = [WorkerExit(verification_id, attempt, "exit code 0", clean=True)]
    loop.tick()
    final = row(factory, verification_id)
    assert (final.state, final.verdict_result, final.failed_attempts) == (State.COMPLETED, "NO-GO", 0)


def dispatched_minilm(factory, settings, artifact, monkeypatch) -> tuple[str, int, DispatchLoop]:
    """A gate-1 MiniLM verification submitted and claimed by the loop, its attempt's secret in this
    process's environment (as the Job's Secret puts it in a pod's): (id, attempt, the loop)."""
    from engine.digests import sha256_file
    from service.schemas import SubmitRequest
    from service.verifications import admit, submit

    source = fixtures_root() / "minilm" / "source"
    with transaction(factory) as session:
        verification_id = submit(session, settings, "alice", admit(settings, SubmitRequest(
            source_uri=source.as_uri(), artifact_uri=artifact.as_uri(), artifact_sha256=sha256_file(artifact),
            gates=[1])), None)[0].id
    dispatcher = RecordingDispatcher()
    loop = DispatchLoop(dispatcher, factory, settings)
    loop.tick()
    ((launched_id, attempt, secret),) = dispatcher.launched
    assert launched_id == verification_id and secret
    monkeypatch.setenv(ATTEMPT_SECRET_ENV, secret)
    return verification_id, attempt, loop


def test_a_real_gate1_verification_through_the_restricted_credential(worker_login, factory, pg, tmp_path,
                                                                     monkeypatch):
    """End to end on Postgres: the loop claims and issues the secret, the Job entrypoint runs a real
    gate-1 verification of MiniLM holding only the worker login and that secret, the loop applies the
    outbox and the verdict is stored with its digests."""
    from service.job import run_verification

    root = fixtures_root() / "minilm"
    artifact = root / "minilm-F32.gguf"
    settings = settings_for(pg, tmp_path, file_roots=(fixtures_root(),), lease_seconds=30)
    verification_id, attempt, loop = dispatched_minilm(factory, settings, artifact, monkeypatch)
    worker_settings = settings.model_copy(update={"database_url": worker_login.url})
    outcome: list[int] = []
    worker = threading.Thread(target=lambda: outcome.append(
        run_verification(worker_settings, verification_id, attempt=attempt, worker_name="pod-e2e")), daemon=True)
    worker.start()
    deadline = time.monotonic() + 180
    while worker.is_alive():
        assert time.monotonic() < deadline, "the worker did not finish"
        loop.tick()
        time.sleep(0.05)
    assert outcome == [0]
    final = row(factory, verification_id)
    assert (final.state, final.verdict_result, final.worker, final.attempt) == (State.COMPLETED, "GO", "pod-e2e", 1)
    with factory() as session:
        verdict = repository.verdict_for(session, verification_id)
        assert verdict is not None and verdict.report["gates"]["storage"]["status"] == "passed"
        assert artifact.as_uri() in {d["uri"] for d in verdict.report["files"]}
    kinds = [(kind, outcome) for kind, _, worker, outcome in reports_of(factory, verification_id)]
    assert ("start", "accepted") in kinds and ("verdict", "accepted") in kinds


def test_grant_worker_creates_a_login_that_reaches_only_the_worker_functions(pg_url, monkeypatch):
    suffix = uuid.uuid4().hex[:8]
    group, login = f"convgate_worker_c{suffix}", f"convgate_worker_c{suffix}_login"
    monkeypatch.setenv("CONVGATE_DATABASE_URL", pg_url)
    monkeypatch.setenv("CONVGATE_ADMIN_DATABASE_URL", pg_url.rsplit("/", 1)[0] + "/postgres")
    try:
        result = CliRunner().invoke(cli_app, ["db", "grant-worker", "--group", group, "--login", login])
        assert result.exit_code == 0, result.output
        url = result.stdout.strip().splitlines()[-1]
        assert f"{login}:" in url and url.endswith(pg_url.rsplit("/", 1)[1])
        engine = make_engine(url)
        try:
            with engine.begin() as connection:
                assert connection.execute(text("SELECT convgate_worker_start('x', 1, repeat('s', 40), 'w')")
                                          ).scalar() is None
            with pytest.raises(ProgrammingError), engine.begin() as connection:
                connection.execute(text("SELECT count(*) FROM api_tokens"))
        finally:
            engine.dispose()
        again = CliRunner().invoke(cli_app, ["db", "grant-worker", "--group", group])  # idempotent, no new login
        assert again.exit_code == 0 and login not in again.stdout
    finally:
        owner = make_engine(pg_url)
        with owner.begin() as connection:
            for name, arguments in WORKER_FUNCTIONS:
                connection.execute(text(f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{group}') "
                                        f"THEN REVOKE EXECUTE ON FUNCTION {name}({arguments}) FROM {group}; "
                                        "END IF; END $$"))
            connection.execute(text(f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{group}') "
                                    f"THEN REVOKE USAGE ON SCHEMA public FROM {group}; END IF; END $$"))
        owner.dispose()
        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f"DROP ROLE IF EXISTS {login}")
            admin.execute(f"DROP ROLE IF EXISTS {group}")


def test_gate1_shards_through_the_restricted_credential(worker_login, factory, pg, tmp_path, monkeypatch):
    """Issue 12 item 4 on Postgres with the restricted login: two shards of one attempt (an Indexed Job's
    pods, sharing the Job's name and the attempt's secret) each file their part as a `shard-<k>` report
    through the revision-0007 function; the loop applies them, and the last one applied writes the merged
    verdict, once."""
    from service.config import KubernetesSettings
    from service.job import run_verification
    from service.persistence.models import Gate1Shard

    artifact = fixtures_root() / "minilm" / "minilm-Q8_0.gguf"
    settings = settings_for(pg, tmp_path, file_roots=(fixtures_root(),), lease_seconds=30, dispatcher="none",
                            kubernetes=KubernetesSettings(gate1_shard_bytes=1 << 20, max_gate1_shards=2))
    verification_id, attempt, loop = dispatched_minilm(factory, settings, artifact, monkeypatch)
    worker_settings = settings.model_copy(update={"database_url": worker_login.url})
    outcomes: list[int] = []
    workers = [threading.Thread(target=lambda shard=shard: outcomes.append(run_verification(
        worker_settings, verification_id, attempt=attempt, worker_name="convgate-job-1", shard=shard)), daemon=True)
        for shard in (0, 1)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 240
    while any(worker.is_alive() for worker in workers):
        assert time.monotonic() < deadline, "the shards did not finish"
        loop.tick()
        time.sleep(0.05)
    assert outcomes == [0, 0]
    final = row(factory, verification_id)
    assert (final.state, final.verdict_result, final.worker) == (State.COMPLETED, "GO", "convgate-job-1")
    with factory() as session:
        verdict = repository.verdict_for(session, verification_id)
        assert verdict is not None and verdict.report["gates"]["storage"]["details"]["shards"]["count"] == 2
        assert session.query(Gate1Shard).filter_by(verification_id=verification_id).count() == 2
    kinds = {(kind, outcome) for kind, _, _, outcome in reports_of(factory, verification_id)}
    assert {("shard-0", "accepted"), ("shard-1", "accepted"), ("start", "accepted")} <= kinds
    assert not any(kind == "verdict" for kind, _ in kinds)


def test_the_worker_login_cannot_file_a_shard_for_another_attempt_or_an_absurd_index(worker_login, factory):
    verification_id = submitted(factory)
    with transaction(factory) as session:
        repository.claim(session, verification_id, "dispatcher")
        secret = issue_attempt_secret(session, verification_id, 1)
    channel = RestrictedChannel(worker_login.engine, verification_id, 1, "job", secret, wait_seconds=0)
    assert not RestrictedChannel(worker_login.engine, verification_id, 2, "job", secret,
                                 wait_seconds=0).record_shard(0, 2, {"part": {}})
    assert not channel.record_shard(10_000, 2, {"part": {}})
    assert channel._call("convgate_worker_record_shard", ("shard", 0), ("report", '{"part": {}}')) is True
