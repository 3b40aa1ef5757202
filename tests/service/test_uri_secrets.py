"""Secrets in submitted URIs (presigned query strings, `user:pass@`) never show: not in the API's
answers, the stored columns, the report, the events or the logs. The worker still fetches with the
real URI, kept only under the stored request's `fetch_uris`, which no endpoint returns."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from edge.download import FetchPolicy
from edge.inputs import InputUris, fetch_and_verify
from edge.redact import HIDDEN, install_log_redaction, redact
from edge.retry import RetryPolicy
from edge.store import ContentStore
from edge.uri_policy import UriPolicy
from engine.errors import ConvgateError
from engine.policy import Policy
from engine.verification import VerifyRequest
from service.api.app import create_app, no_loops
from service.auth import Role
from service.fetching import FETCH_URIS, input_uris, public_request, stored_request
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from service.schemas import SubmitRequest
from service.verifications import admit, submit
from tests.service.conftest import add_token, settings_for
from tests.unit.test_redact_uri import secret_uris

SECRETS = ("SIGSECRET", "CREDSECRET", "hunter2", "TOKSECRET")
PRESIGNED = ("https://8.8.8.8/bucket/m.gguf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=CREDSECRET"
             "&X-Amz-Signature=SIGSECRET")
WITH_PASSWORD = "https://alice:hunter2@8.8.8.8/m.gguf"
SHA = "c" * 64


def leaks(blob: str) -> list[str]:
    return [secret for secret in SECRETS if secret in blob]


@pytest.mark.parametrize(("uri", "shown"), [
    (PRESIGNED, "https://8.8.8.8/bucket/m.gguf?X-Amz-Algorithm=REDACTED&X-Amz-Credential=REDACTED"
                "&X-Amz-Signature=REDACTED"),
    (WITH_PASSWORD, "https://REDACTED@8.8.8.8/m.gguf"),
    ("https://h.example/m.gguf?sig=TOKSECRET&token#frag", "https://h.example/m.gguf?sig=REDACTED&REDACTED#REDACTED"),
    ("hf://org/m@0123456789abcdef0123456789abcdef01234567/m.gguf",
     "hf://org/m@0123456789abcdef0123456789abcdef01234567/m.gguf"),
    ("file:///models/m.gguf", "file:///models/m.gguf"),
    ("https://[::1/x?sig=TOKSECRET", "https://REDACTED"),
])
def test_redact_hides_query_values_and_userinfo_and_keeps_the_rest(uri, shown):
    assert redact(uri) == shown
    assert redact(f"GET {uri}: HTTP 503 ('{uri}')") == f"GET {shown}: HTTP 503 ('{shown}')"
    assert redact("no URL here, just text?sig=x") == "no URL here, just text?sig=x"


def test_stored_request_keeps_the_originals_apart():
    plain = {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "release_files": []}
    assert stored_request(plain) == plain  # nothing to hide: stored as submitted
    secret = plain | {"artifact_uri": PRESIGNED, "release_files": ["file:///models/x?TOKSECRET"]}
    stored = stored_request(secret)
    assert not leaks(json.dumps(public_request(stored)))
    assert stored[FETCH_URIS]["artifact_uri"] == PRESIGNED
    uris = input_uris(stored)
    assert (uris.source, uris.artifact, uris.release_files) == (
        "file:///models/m", PRESIGNED, ("file:///models/x?TOKSECRET",))
    assert input_uris(plain).artifact == "file:///models/m.gguf"
    assert input_uris(plain).imatrix is None


def test_an_imatrix_uri_is_stored_redacted_and_fetched_with_the_original():
    plain = {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "release_files": []}
    stored = stored_request(plain | {"imatrix_uri": PRESIGNED, "imatrix_sha256": SHA})
    assert not leaks(json.dumps(public_request(stored))) and HIDDEN in stored["imatrix_uri"]
    assert input_uris(stored).imatrix == PRESIGNED


@pytest.fixture
def api(sqlite_url, tmp_path):
    settings = settings_for(sqlite_url, tmp_path, allow_file_uris=True, file_roots=(Path("/models"),))
    app = create_app(settings, loops=no_loops)
    with TestClient(app) as client:
        client.token = add_token(sqlite_url, Role.ADMIN, "admin-secrets")
        client.url = sqlite_url
        yield client


@pytest.mark.parametrize("artifact", [PRESIGNED, WITH_PASSWORD])
def test_the_api_and_the_stored_columns_show_no_secret(api, artifact):
    headers = {"Authorization": f"Bearer {api.token}"}
    body = {"source_uri": "file:///models/m", "artifact_uri": artifact, "artifact_sha256": SHA}
    created = api.post("/v1/verifications", json=body, headers=headers)
    assert created.status_code == 202, created.text
    ident = created.json()["id"]
    answers = [created.text, api.get(f"/v1/verifications/{ident}", headers=headers).text,
               api.get("/v1/verifications", headers=headers).text,
               api.get(f"/v1/verifications/{ident}/events", headers=headers).text]
    assert all(HIDDEN in answer for answer in answers[:3])
    assert not leaks("".join(answers))
    engine = make_engine(api.url)
    with engine.connect() as connection:
        row = connection.execute(text("SELECT source_uri, artifact_uri, request FROM verifications")).one()
    engine.dispose()
    assert not leaks(row[0] + row[1])
    request = json.loads(row[2]) if isinstance(row[2], str) else row[2]
    assert request[FETCH_URIS]["artifact_uri"] == artifact  # what the worker fetches with
    assert not leaks(json.dumps(public_request(request)))


def test_a_reused_idempotency_key_with_another_uri_secret_is_a_409(api):
    """Issue 34: a body differing only in a URI's secret (a new presigned signature) answered with the first
    verification and dropped the new URL, which the worker would never fetch with. The secret is part of
    what was asked: a 409, as for any other difference; the same body again is still the first's 200."""
    headers = {"Authorization": f"Bearer {api.token}", "Idempotency-Key": "build-4711"}

    def body(signature: str) -> dict[str, str]:
        return {"source_uri": "file:///models/m", "artifact_sha256": SHA,
                "artifact_uri": PRESIGNED.replace("SIGSECRET", signature)}

    first = api.post("/v1/verifications", json=body("SIGSECRET"), headers=headers)
    again = api.post("/v1/verifications", json=body("SIGSECRET"), headers=headers)
    changed = api.post("/v1/verifications", json=body("SIGSECRET2"), headers=headers)
    assert (first.status_code, again.status_code, changed.status_code) == (202, 200, 409), changed.text
    assert again.json()["id"] == first.json()["id"]
    assert changed.json()["code"] == "submission.idempotency_conflict" and not leaks(changed.text)


def test_a_refused_uri_error_quotes_no_secret(api):
    headers = {"Authorization": f"Bearer {api.token}"}
    body = {"source_uri": "file:///models/m", "artifact_uri": "http://u:hunter2@8.8.8.8/m?sig=SIGSECRET",
            "artifact_sha256": SHA}
    refused = api.post("/v1/verifications", json=body, headers=headers)
    assert refused.status_code == 422 and "scheme 'http'" in refused.text
    assert not leaks(refused.text)


def test_a_transient_failure_ends_the_attempt_without_verdict_and_leaks_nothing(sqlite_url, tmp_path, caplog):
    """The job entrypoint: a server that never answers is retried, then the attempt ends unjudged
    (the dispatcher retries it later); no NO-GO is stored and events and logs show no secret."""
    from service.job import run_verification

    source = tmp_path / "models" / "m"
    source.mkdir(parents=True)
    settings = settings_for(sqlite_url, tmp_path, file_roots=(tmp_path / "models",), allow_private_addresses=True,
                            fetch_attempts=2, fetch_backoff_seconds=0.0, max_attempts=3)
    artifact = "https://user:hunter2@127.0.0.1:1/m.gguf?X-Amz-Signature=SIGSECRET&token=TOKSECRET"
    factory = session_factory(make_engine(sqlite_url))
    with transaction(factory) as session:
        verification, _ = submit(session, settings, "alice", admit(settings, SubmitRequest(
            source_uri=source.as_uri(), artifact_uri=artifact, artifact_sha256=SHA)), None)
        ident = verification.id
        assert repository.claim(session, ident, "test-dispatcher") is not None
    caplog.set_level(logging.DEBUG)
    assert run_verification(settings, ident, "test-worker", 1) == 1
    with factory() as session:
        row = repository.get_verification(session, ident)
        events = " | ".join(e.message + " " + str(getattr(e, "detail", "")) for e in repository.events(session, ident))
        assert row.verdict_result is None and repository.verdict_for(session, ident) is None
        assert row.state in ("queued", "dispatched")  # waiting for another attempt, not finished
    assert "ConnectError" in events and "gave up after 2 tries" in events
    assert not leaks(events) and not leaks(caplog.text)
    assert "ConnectError" in caplog.text  # the failure was logged, redacted


def test_a_report_names_the_artifact_without_its_secret(tmp_path, caplog):
    """Through the edge and the engine: the report's artifact URI and a blocker quoting it are redacted."""
    import ssl

    import trustme

    from tests.integration.test_fetch import ROUTES, serve

    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    ROUTES["/signed.gguf"] = (200, {}, b"GGUF-not-really")
    source = tmp_path / "m"
    source.mkdir()
    fetch = FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=(tmp_path,), allow_private_addresses=True),
                        verify=client_tls, timeout_s=5, retry=RetryPolicy(attempts=1))
    install_log_redaction()
    caplog.set_level(logging.DEBUG)
    for _, port in serve(server_tls):
        for path, code in (("/signed.gguf", None), ("/absent.gguf", "artifact.fetch_failed")):
            uri = f"https://127.0.0.1:{port}{path}?X-Amz-Signature=SIGSECRET&X-Amz-Credential=CREDSECRET"
            report = fetch_and_verify(VerifyRequest(gates=frozenset({1})), InputUris(source=source.as_uri(),
                                      artifact=uri), Policy(), fetch, ContentStore(tmp_path / "cache"))
            document = report.model_dump_json()
            assert report.verdict == "NO-GO" and not leaks(document)
            if code is None:
                assert report.artifact is not None and report.artifact.uri == redact(uri)
            else:
                assert [b.code for b in report.blockers] == [code] and "404" in report.blockers[0].why
    assert "HTTP Request" in caplog.text and not leaks(caplog.text)  # httpx logs every URL it requests


# --- issue 22: every URI form, through the API, the logs, the access log, the export and a report -----

PUBLIC_HOSTS = st.sampled_from(["8.8.8.8", "[2001:4860:4860::8888]", "8.8.4.4:8443"])


@pytest.fixture(scope="module")
def shared_api(tmp_path_factory):
    """One app for every generated example (hypothesis runs many inside one test)."""
    from service.persistence.migrate import upgrade

    root = tmp_path_factory.mktemp("uri-secrets")
    url = f"sqlite:///{root / 'convgate.db'}"
    upgrade(url)
    settings = settings_for(url, root, allow_file_uris=True, file_roots=(Path("/models"),))
    with TestClient(create_app(settings, loops=no_loops)) as client:
        client.token = add_token(url, Role.ADMIN, "admin-properties")
        client.url = url
        secret = client.post("/v1/callback-secret", headers={"Authorization": f"Bearer {client.token}"})
        assert secret.status_code == 201
        yield client


def _everything_shown(api, uri: str, created) -> list[str]:
    """Every answer and stored row a reader can see after one submission quoting `uri`."""
    headers = {"Authorization": f"Bearer {api.token}"}
    shown = [created.text, api.get("/v1/verifications", headers=headers, params={"source_uri": uri}).text,
             api.get("/v1/verdicts/export", headers=headers, params={"source_uri": uri}).text,
             api.get("/v1/access-log", headers=headers).text]
    if created.status_code == 202:
        ident = created.json()["id"]
        shown += [api.get(f"/v1/verifications/{ident}{tail}", headers=headers).text
                  for tail in ("", "/events", "/callbacks", "/report")]
    engine = make_engine(api.url)
    with engine.connect() as connection:
        # the callback_url column is what the loop POSTs to (like fetch_uris, never returned)
        for table, columns in (("verifications", "source_uri, artifact_uri"),
                               ("verification_events", "*"), ("access_log", "*")):
            shown += [str(row) for row in connection.execute(text(f"SELECT {columns} FROM {table}"))]
        shown += [json.dumps(public_request(json.loads(row[0]) if isinstance(row[0], str) else row[0]))
                  for row in connection.execute(text("SELECT request FROM verifications"))]
    engine.dispose()
    return shown


def _submit_and_look(api, uri: str, caplog) -> list[str]:
    body = {"source_uri": "file:///models/m", "artifact_uri": uri, "artifact_sha256": SHA}
    if uri.startswith("https://"):
        body["callback_url"] = uri
    created = api.post("/v1/verifications", json=body, headers={"Authorization": f"Bearer {api.token}"})
    assert created.status_code in (202, 422), created.text
    return [*_everything_shown(api, uri, created), caplog.text]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=secret_uris(hosts=PUBLIC_HOSTS, schemes=st.just("https")))
def test_no_uri_form_shows_its_secret_anywhere(shared_api, caplog, case):
    """userinfo with any character, query values, `;params`, percent-encoded delimiters, hf://?token=:
    the secret is in no API answer, stored column, event, export, access-log row or log line."""
    uri, secret = case
    install_log_redaction()
    caplog.set_level(logging.INFO)
    shown = _submit_and_look(shared_api, uri, caplog)
    assert not [blob for blob in shown if secret in blob]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=secret_uris(spaces=True, hosts=PUBLIC_HOSTS, schemes=st.just("https")))
def test_no_uri_field_with_spaces_shows_its_secret(shared_api, caplog, case):
    """A URI field with whitespace is refused (422) and the refusal quotes no part of it."""
    uri, secret = case
    install_log_redaction()
    caplog.set_level(logging.INFO)
    shown = _submit_and_look(shared_api, uri, caplog)
    assert not [blob for blob in shown if secret in blob]


@settings(max_examples=20, deadline=None)
@given(case=secret_uris(hosts=st.just("8.8.8.8")))
def test_a_refused_uri_is_reported_without_its_secret(tmp_path_factory, case):
    """The report of a fetch the URI policy refuses quotes the URI in its blocker; hf:// with ?token= too."""
    uri, secret = case
    root = tmp_path_factory.mktemp("refused")
    (root / "m").mkdir()
    fetch = FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=(root,)), verify=True, timeout_s=1,
                        retry=RetryPolicy(attempts=1), hf_endpoint="https://127.0.0.1:1")
    try:
        report = fetch_and_verify(VerifyRequest(gates=frozenset({1})), InputUris(
            source=(root / "m").as_uri(), artifact=uri), Policy(), fetch, ContentStore(root / "cache"))
    except ConvgateError as exc:  # no verdict (the hub endpoint did not answer): the reason is what is kept
        assert secret not in str(exc)
        return
    assert secret not in report.model_dump_json()
