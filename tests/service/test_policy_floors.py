"""Issue 10 item 9: thresholds come from policies the operator configured. An inline policy is
refused unless the caller's role may author policies, and whatever was not a configured policy is
visibly marked: in the API, in the rendered report and in the auditors' filters. A caller cannot
borrow a configured policy's version. Run on SQLite and on Postgres."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from engine.policy import Policy
from service.api.app import create_app, no_loops
from service.auth import Role
from service.config import Settings
from service.persistence import repository
from service.persistence.db import transaction
from tests.service.conftest import add_token, settings_for

SHA = "c" * 64
STRICT = Policy(version="platform-strict-1", tie_ulps=1)
WEAK = {"token_ids_exact": False, "reproduce_quantized": False, "require_top1_equal": False}


@pytest.fixture(params=["sqlite", "postgres"])
def api(request, tmp_path):
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")
    settings = settings_for(url, tmp_path, policies={"default": Policy(), "strict": STRICT},
                            file_roots=(Path("/models"),))
    app = create_app(settings, loops=no_loops)
    tokens = {role: add_token(url, role, f"{role.value}-{request.param}") for role in Role}
    with TestClient(app) as client:
        client.tokens = tokens
        client.app_state = app.state
        yield client


def submit(api, who: Role, **overrides):
    body = {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "artifact_sha256": SHA,
            **overrides}
    return api.post("/v1/verifications", json=body, headers={"Authorization": f"Bearer {api.tokens[who]}"})


def get(api, path: str, who: Role = Role.AUDITOR, **kwargs):
    return api.get(path, headers={"Authorization": f"Bearer {api.tokens[who]}"} | kwargs.pop("headers", {}),
                   **kwargs)


def complete(api, verification_id: str) -> None:
    with transaction(api.app_state.session_factory) as session:
        verification = repository.get_verification(session, verification_id)
        report = {"verdict": "GO", "blockers": [], "gates": {},
                  "policy": {"values": verification.policy, "sha256": verification.policy_sha256},
                  "artifact": {"uri": "file:///models/m.gguf", "sha256": SHA, "size": 1},
                  "files": [], "not_verified": [], "environment": {}, "timings": {}}
        attempt = repository.claim(session, verification_id, "test").attempt
        assert repository.start_attempt(session, verification_id, "test", attempt=attempt) is not None
        assert repository.record_verdict(session, verification_id, attempt, report, worker="test")


@pytest.mark.parametrize("who", [Role.SUBMITTER, Role.OPERATOR, Role.AUDITOR])
def test_an_inline_policy_is_refused_for_roles_that_may_not_author_policies(api, who):
    response = submit(api, who, policy=WEAK)
    assert response.status_code == 403, response.text
    if who == Role.SUBMITTER:
        assert "inline polic" in response.json()["detail"] and "policy-author" in response.json()["detail"]


@pytest.mark.parametrize("who", [Role.POLICY_AUTHOR, Role.ADMIN])
def test_an_inline_policy_is_accepted_for_policy_authors_and_marked_inline(api, who):
    response = submit(api, who, policy=WEAK)
    assert response.status_code == 202, response.text
    created = response.json()
    assert created["policy_origin"] == "inline"
    assert created["policy_version"].startswith("inline-")


def test_a_configured_policy_is_marked_with_its_name_and_hash(api):
    created = submit(api, Role.SUBMITTER, policy="strict").json()
    assert created["policy_origin"] == "configured:strict"
    assert created["policy_version"] == "platform-strict-1"
    assert created["policy_sha256"] == STRICT.sha256()
    default = submit(api, Role.SUBMITTER).json()
    assert (default["policy_origin"], default["policy_sha256"]) == ("configured:default", Policy().sha256())


def test_an_inline_policy_cannot_wear_a_configured_version(api):
    mimic = STRICT.model_dump(mode="json")  # the exact values and version of a configured policy
    created = submit(api, Role.POLICY_AUTHOR, policy=mimic).json()
    assert created["policy_origin"] == "inline"
    assert created["policy_version"] == "inline-platform-strict-1"
    assert created["policy_sha256"] != STRICT.sha256()
    with transaction(api.app_state.session_factory) as session:
        stored = repository.get_verification(session, created["id"])
        assert stored.policy["version"] == "inline-platform-strict-1"  # what the worker runs and reports
        assert Policy.model_validate(stored.policy).sha256() == stored.policy_sha256


def test_the_report_says_the_verdict_was_made_under_an_inline_policy(api):
    inline = submit(api, Role.POLICY_AUTHOR, policy=WEAK).json()["id"]
    configured = submit(api, Role.SUBMITTER, policy="strict").json()["id"]
    for verification_id in (inline, configured):
        complete(api, verification_id)
    markdown = get(api, f"/v1/verifications/{inline}/report", headers={"Accept": "text/markdown"}).text
    assert "inline policy" in markdown.lower() and "not a policy configured by the operator" in markdown
    page = get(api, f"/v1/verifications/{inline}/report", headers={"Accept": "text/html"}).text
    assert "not a policy configured by the operator" in page
    as_json = get(api, f"/v1/verifications/{inline}/report").json()
    assert as_json["policy"]["origin"] == "inline"
    trusted = get(api, f"/v1/verifications/{configured}/report", headers={"Accept": "text/markdown"}).text
    assert "configured policy `strict`" in trusted and "not a policy configured" not in trusted
    assert get(api, f"/v1/verifications/{configured}/report").json()["policy"]["origin"] == "configured:strict"


def test_auditors_filter_by_policy_origin_and_name(api):
    inline = submit(api, Role.POLICY_AUTHOR, policy=WEAK).json()["id"]
    strict = submit(api, Role.SUBMITTER, policy="strict").json()["id"]
    default = submit(api, Role.SUBMITTER).json()["id"]

    def ids(**params) -> set[str]:
        response = get(api, "/v1/verifications", params=params)
        assert response.status_code == 200, response.text
        return {item["id"] for item in response.json()["items"]}

    assert ids(policy_origin="inline") == {inline}
    assert ids(policy_origin="configured") == {strict, default}
    assert ids(policy="strict") == {strict}
    assert ids(policy="default", policy_origin="configured") == {default}
    assert ids(policy="strict", policy_origin="inline") == set()
    assert get(api, "/v1/verifications", params={"policy_origin": "borrowed"}).status_code == 422


def test_settings_refuse_a_configured_policy_that_looks_inline_and_bad_names():
    with pytest.raises(ValidationError, match="inline"):
        Settings(policies={"x": Policy(version="inline-2026")})
    with pytest.raises(ValidationError, match="policy name"):
        Settings(policies={"Bad Name!": Policy()})
    with pytest.raises(ValidationError, match="at least one"):
        Settings(policies={})
