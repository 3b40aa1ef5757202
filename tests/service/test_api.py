"""The HTTP API on the embedded default (SQLite): every endpoint's roles, submission rules,
idempotency, reports by Accept header, list filters and cursors, queue, metrics, probes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app, no_loops
from service.auth import Role
from service.persistence import repository, tokens
from service.persistence.db import transaction
from tests.service.conftest import add_token, settings_for

SHA = "b" * 64


@pytest.fixture
def api(sqlite_url, tmp_path):
    settings = settings_for(sqlite_url, tmp_path, allow_file_uris=True, file_roots=(Path("/models"),),
                            metrics_public=False)
    app = create_app(settings, loops=no_loops)
    by_role = {role: add_token(sqlite_url, role, f"{role.value}-1") for role in Role}
    by_role["other-submitter"] = add_token(sqlite_url, Role.SUBMITTER, "submitter-2")
    with TestClient(app) as client:
        client.tokens = by_role
        client.app_state = app.state
        yield client


def auth(api, who) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.tokens[who]}"}


def body(**overrides) -> dict:
    return {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "artifact_sha256": SHA,
            **overrides}


def submit(api, who=Role.SUBMITTER, key=None, **overrides):
    headers = auth(api, who) | ({"Idempotency-Key": key} if key else {})
    return api.post("/v1/verifications", json=body(**overrides), headers=headers)


def complete(api, verification_id: str, verdict: str = "GO", sha: str = SHA) -> None:
    report = {"verdict": verdict, "blockers": [] if verdict == "GO" else [{"code": "tensor.value_mismatch",
              "gate": "storage", "why": "<script>alert(1)</script>", "tensor": "t", "text": None}],
              "gates": {"storage": {"name": "storage", "status": "passed", "seconds": 2.0, "details": {}}},
              "policy": {"values": {"version": "v", "tie_ulps": 4}, "sha256": "p" * 64},
              "artifact": {"uri": "file:///models/m.gguf", "sha256": sha, "size": 1},
              "files": [{"uri": "file:///models/m.gguf", "sha256": sha, "size": 1}],
              "not_verified": ["retrieval quality"], "environment": {}, "timings": {}}
    with transaction(api.app_state.session_factory) as session:
        attempt = repository.claim(session, verification_id, "test").attempt
        assert repository.start_attempt(session, verification_id, "test", attempt=attempt) is not None
        assert repository.record_verdict(session, verification_id, attempt, report, worker="test")


ROLE_MATRIX = [
    # (method, path template, allowed roles)
    ("POST", "/v1/verifications", {Role.SUBMITTER, Role.POLICY_AUTHOR, Role.ADMIN}),
    ("GET", "/v1/verifications/{id}", set(Role) - {Role.POLICY_AUTHOR}),  # a submitter's: not the author's own
    ("GET", "/v1/verifications", set(Role)),
    ("GET", "/v1/verifications/{id}/report", set(Role) - {Role.POLICY_AUTHOR}),
    ("GET", "/v1/verifications/{id}/events", set(Role) - {Role.POLICY_AUTHOR}),
    ("GET", "/v1/verifications/{id}/attestation", set(Role) - {Role.POLICY_AUTHOR}),
    ("GET", "/v1/verifications/{id}/callbacks", set(Role) - {Role.POLICY_AUTHOR}),
    ("GET", "/v1/verdicts/export", set(Role)),
    ("POST", "/v1/callback-secret", {Role.SUBMITTER, Role.POLICY_AUTHOR, Role.ADMIN}),
    ("POST", "/v1/verifications/{id}/cancel", {Role.SUBMITTER, Role.OPERATOR, Role.ADMIN}),  # author: own only
    ("GET", "/v1/queue", {Role.OPERATOR, Role.ADMIN}),
    ("GET", "/ui/queue/table", {Role.OPERATOR, Role.ADMIN}),
    ("GET", "/v1/access-log", {Role.AUDITOR, Role.ADMIN}),
    ("GET", "/metrics", {Role.OPERATOR, Role.ADMIN}),  # metrics_public=False
]


@pytest.mark.parametrize(("method", "path", "allowed"), ROLE_MATRIX, ids=[f"{m} {p}" for m, p, _ in ROLE_MATRIX])
def test_every_endpoint_admits_exactly_its_roles(api, method, path, allowed):
    for role in Role:
        created = submit(api, key=f"{method}{path}{role}").json()["id"]
        complete(api, created)
        kwargs = {"json": body()} if method == "POST" and path == "/v1/verifications" else {}
        response = api.request(method, path.format(id=created), headers=auth(api, role), **kwargs)
        assert (response.status_code < 400) == (role in allowed), (role, response.status_code, response.text)
        if role not in allowed:
            assert response.status_code == (404 if role == Role.POLICY_AUTHOR and "{id}" in path else 403)
    assert api.request(method, path.format(id="x")).status_code == 401
    assert api.request(method, path.format(id="x"), headers={"Authorization": "Bearer nope"}).status_code == 401


def test_revoked_token_is_refused(api, sqlite_url):
    from service.persistence.db import make_engine, session_factory

    engine = make_engine(sqlite_url)
    with transaction(session_factory(engine)) as session:
        assert tokens.revoke_token(session, "auditor-1")
    engine.dispose()
    assert api.get("/v1/verifications", headers=auth(api, Role.AUDITOR)).status_code == 401


def test_submitters_see_only_their_own(api):
    mine = submit(api).json()["id"]
    theirs = submit(api, who="other-submitter").json()["id"]
    assert api.get(f"/v1/verifications/{theirs}", headers=auth(api, Role.SUBMITTER)).status_code == 404
    listed = api.get("/v1/verifications", headers=auth(api, Role.SUBMITTER)).json()["items"]
    assert [item["id"] for item in listed] == [mine]
    assert {i["id"] for i in api.get("/v1/verifications", headers=auth(api, Role.AUDITOR)).json()["items"]} == {
        mine, theirs}


def test_submission_returns_202_location_and_fixes_the_policy(api):
    response = submit(api, Role.POLICY_AUTHOR, policy={"tie_ulps": 2})
    assert response.status_code == 202
    created = response.json()
    assert response.headers["location"] == f"/v1/verifications/{created['id']}"
    assert created["state"] == "queued"
    from engine.policy import Policy

    inline = Policy(tie_ulps=2, version=f"inline-{Policy().version}")
    assert created["policy_sha256"] == inline.sha256() != Policy().sha256()


@pytest.mark.parametrize(
    ("overrides", "status"),
    [({"artifact_sha256": "xyz"}, 422), ({"policy": "nonexistent"}, 422), ({"policy": {"tie_ulps": 300}}, 422),
     ({"artifact_uri": "ftp://h/x"}, 422), ({"source_uri": "https://example.com/model"}, 422),
     ({"artifact_uri": "hf://org/m@main/x.gguf"}, 422), ({"gates": [4]}, 422), ({"extra": 1}, 422),
     ({"texts": ["a"] * 1001}, 422), ({"texts": ["x" * 8193]}, 422), ({"texts": ["é" * 4000] * 80}, 422),
     ({"texts": [""]}, 422), ({"texts": ["a\x00b"]}, 422), ({"source_uri": "file:///models/m\x00"}, 422),
     ({"imatrix_uri": "file:///models/m.dat"}, 422), ({"imatrix_sha256": "a" * 64}, 422),
     ({"imatrix_uri": "file:///models/m.dat", "imatrix_sha256": "xyz"}, 422),
     ({"imatrix_uri": "ftp://h/m.dat", "imatrix_sha256": "a" * 64}, 422),
     ({"imatrix_uri": "file:///elsewhere/m.dat", "imatrix_sha256": "a" * 64}, 422)],
)
def test_invalid_submissions(api, overrides, status):
    response = submit(api, **overrides)
    assert response.status_code == status, response.text


def test_an_importance_matrix_is_submitted_with_its_digest_and_stored_for_the_worker(api):
    response = submit(api, imatrix_uri="file:///models/imatrix.gguf", imatrix_sha256="a" * 64)
    assert response.status_code == 202, response.text
    with transaction(api.app_state.session_factory) as session:
        stored = repository.get_verification(session, response.json()["id"]).request
    assert (stored["imatrix_uri"], stored["imatrix_sha256"]) == ("file:///models/imatrix.gguf", "a" * 64)
    plain = submit(api, key="no-imatrix")
    with transaction(api.app_state.session_factory) as session:
        assert "imatrix_uri" not in repository.get_verification(session, plain.json()["id"]).request


def test_an_unpaired_surrogate_is_a_422_not_a_500(api):
    raw = json.dumps(body()).replace("m.gguf", "\\ud800.gguf").encode()  # valid JSON, not valid Unicode
    response = api.post("/v1/verifications", content=raw, headers=auth(api, Role.SUBMITTER) | {
        "Content-Type": "application/json"})
    assert response.status_code == 422, response.text


def test_idempotency_key_returns_the_same_verification_or_conflicts(api):
    first = submit(api, key="k")
    again = submit(api, key="k")
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    assert submit(api, key="k", kind="embedding").status_code == 409
    assert submit(api, who="other-submitter", key="k").json()["id"] != first.json()["id"]


def test_report_by_accept_header_with_model_card(api):
    created = submit(api).json()["id"]
    headers = auth(api, Role.AUDITOR)
    assert api.get(f"/v1/verifications/{created}/report", headers=headers).status_code == 404  # no verdict yet
    complete(api, created)
    as_json = api.get(f"/v1/verifications/{created}/report", headers=headers)
    assert as_json.json()["verdict"] == "GO"
    markdown = api.get(f"/v1/verifications/{created}/report", headers=headers | {"Accept": "text/markdown"})
    assert markdown.headers["content-type"].startswith("text/markdown")
    assert "## Verification (model card section)" in markdown.text and SHA in markdown.text
    assert "tie_ulps=4" in markdown.text and "retrieval quality" in markdown.text
    page = api.get(f"/v1/verifications/{created}/report", headers=headers | {"Accept": "text/html"})
    assert page.text.startswith("<!doctype html>") and SHA in page.text
    assert "<table>" in page.text and "<h2>Verification (model card section)</h2>" in page.text
    assert api.get(f"/v1/verifications/{created}", headers=headers).json()["verdict"] == "GO"


def test_auditor_filters_and_cursor_pages(api):
    other = hashlib.sha256(b"other").hexdigest()
    ids = []
    for i in range(7):
        created = submit(api, key=f"f{i}", artifact_sha256=other if i % 2 else SHA).json()["id"]
        complete(api, created, "GO" if i % 3 else "NO-GO", other if i % 2 else SHA)
        ids.append(created)
    headers = auth(api, Role.AUDITOR)
    by_sha = api.get("/v1/verifications", params={"artifact_sha256": other}, headers=headers).json()["items"]
    assert {item["id"] for item in by_sha} == {ids[1], ids[3], ids[5]}
    nogo = api.get("/v1/verifications", params={"verdict": "NO-GO"}, headers=headers).json()["items"]
    assert {item["id"] for item in nogo} == {ids[0], ids[3], ids[6]}
    seen, cursor = [], None
    while True:
        page = api.get("/v1/verifications", params={"limit": 3} | ({"cursor": cursor} if cursor else {}),
                       headers=headers).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    assert api.get("/v1/verifications", params={"cursor": "garbage"}, headers=headers).status_code == 400


def _b64(raw: str) -> str:
    import base64

    return base64.urlsafe_b64encode(raw.encode()).decode()


BAD_CURSORS = ["MQ==", "garbage", "", "%%%", _b64("null"), _b64('{"a": 1}'), _b64("[1, 2, 3]"), _b64("[null, 1]"),
               _b64('["yesterday", "x"]'), _b64('[1e400, "x"]'), _b64('["2026-01-01T00:00:00", null]'),
               _b64("\x00"), _b64('["2026-01-01T00:00:00+00:00", "x\\u0000"]'), "\u00e9"]


@pytest.mark.parametrize("cursor", BAD_CURSORS)
def test_a_bad_cursor_is_a_400_never_a_500(api, cursor):
    response = api.get("/v1/verifications", params={"cursor": cursor}, headers=auth(api, Role.AUDITOR))
    assert response.status_code == 400, response.text
    assert response.json()["detail"] == "invalid cursor"


def test_bad_query_and_path_values_are_4xx(api):
    headers = auth(api, Role.AUDITOR)
    for params in ({"state": "sleeping"}, {"limit": 0}, {"since": "tuesday"}, {"source_uri": "x\x00"},
                   {"submitted_by": "a\x00"}, {"policy": "\x00"}):
        response = api.get("/v1/verifications", params=params, headers=headers)
        assert 400 <= response.status_code < 500, (params, response.status_code)
    for path in ("/v1/verifications/not-a-uuid", "/v1/verifications/%00", "/v1/verifications/%00/report"):
        assert api.get(path, headers=headers).status_code == 422


def test_request_bodies_are_limited(api):
    huge = json.dumps(body(texts=["x" * 1000] * 1100)).encode()  # ~1.1 MB, over the 1 MiB limit
    response = api.post("/v1/verifications", content=huge, headers=auth(api, Role.SUBMITTER) | {
        "Content-Type": "application/json"})
    assert response.status_code == 413, response.text

    def chunks():  # no Content-Length: the limit is counted on the stream
        for _ in range(1100):
            yield b"x" * 1000

    streamed = api.post("/v1/verifications", content=chunks(), headers=auth(api, Role.SUBMITTER) | {
        "Content-Type": "application/json"})
    assert streamed.status_code == 413, streamed.text
    assert submit(api, texts=["y" * 8000] * 60).status_code == 202  # ~480 KB of texts is fine


def test_the_ui_token_never_travels_in_a_url_and_the_cookie_is_strict(sqlite_url, tmp_path):
    app = create_app(settings_for(sqlite_url, tmp_path), loops=no_loops)
    operator = add_token(sqlite_url, Role.OPERATOR, "op")
    with TestClient(app, base_url="https://testserver") as client:
        legacy = client.get(f"/ui/queue?token={operator}", follow_redirects=False)
        assert legacy.status_code == 401 and "set-cookie" not in legacy.headers
        form = client.get("/ui/login")
        assert form.status_code == 200 and 'method="post"' in form.text and 'type="password"' in form.text
        refused = client.post("/ui/login", data={"token": "cg_wrong"}, follow_redirects=False)
        assert refused.status_code == 401 and "set-cookie" not in refused.headers
        login = client.post("/ui/login", data={"token": operator}, follow_redirects=False)
        assert login.status_code == 303 and login.headers["location"] == "/ui/queue"
        cookie = login.headers["set-cookie"].lower()
        for attribute in ("secure", "httponly", "samesite=strict", "path=/ui"):
            assert attribute in cookie, cookie
        assert operator not in login.headers["location"]
        assert client.get("/ui/queue").status_code == 200  # the browser sends the cookie on its own reads
        assert client.get("/ui/queue/table").status_code == 200
        # the cookie authenticates nothing else: no JSON API read, no write
        jar = {"convgate_token": client.cookies["convgate_token"]}
        with TestClient(app, base_url="https://testserver", cookies=jar) as other:
            assert other.get("/v1/queue").status_code == 401
            assert other.post("/v1/verifications", json=body()).status_code == 401
            assert other.post(f"/v1/verifications/{'0' * 8}-0000-4000-8000-{'0' * 12}/cancel").status_code == 401
            assert other.get("/ui/queue").status_code == 200
        auditor = add_token(sqlite_url, Role.AUDITOR, "aud")
        assert client.post("/ui/login", data={"token": auditor}, follow_redirects=False).status_code == 403
        foreign = client.post("/ui/login", data={"token": operator}, headers={"Origin": "https://evil.example"},
                              follow_redirects=False)
        assert foreign.status_code == 403 and "set-cookie" not in foreign.headers
        out = client.post("/ui/logout", follow_redirects=False)
        assert out.status_code == 303 and "max-age=0" in out.headers["set-cookie"].lower()


def test_cancel_and_events(api):
    created = submit(api).json()["id"]
    cancelled = api.post(f"/v1/verifications/{created}/cancel", headers=auth(api, Role.OPERATOR)).json()
    assert cancelled["state"] == "cancelled"
    events = api.get(f"/v1/verifications/{created}/events", headers=auth(api, Role.AUDITOR)).json()
    assert [e["to_state"] for e in events] == ["queued", "cancelled"]


def test_queue_metrics_and_probes(api):
    submit(api, key="q1")
    done = submit(api, key="q2").json()["id"]
    complete(api, done, "NO-GO")
    queue = api.get("/v1/queue", headers=auth(api, Role.OPERATOR)).json()
    assert queue["counts"] == {"queued": 1, "completed": 1}
    assert queue["oldest_waiting"]["state"] == "queued" and queue["dispatcher"] == "local"
    assert api.get("/metrics").status_code == 401  # metrics_public=False: an operator's token
    assert api.get("/metrics", headers=auth(api, Role.SUBMITTER)).status_code == 403
    metrics = api.get("/metrics", headers=auth(api, Role.OPERATOR)).text
    assert 'convgate_verifications{state="queued"} 1.0' in metrics
    assert 'convgate_verdicts_total{verdict="NO-GO"} 1.0' in metrics
    assert 'convgate_gate_duration_seconds_bucket{gate="storage",le="2.5"} 1.0' in metrics
    assert api.get("/healthz").text == "ok" and api.get("/readyz").text == "ready"
    assert "/v1/verifications" in json.dumps(api.get("/openapi.json").json()["paths"])


def test_html_report_escapes_what_came_from_the_artifact(api):
    created = submit(api).json()["id"]
    complete(api, created, "NO-GO")
    page = api.get(f"/v1/verifications/{created}/report", headers=auth(api, Role.AUDITOR) | {"Accept": "text/html"})
    assert "<script>" not in page.text and "&lt;script&gt;" in page.text
