"""The API's error bodies carry the stable code of the error behind them (service/api/errors.py): a
client branches on `code`, which the message may reword without breaking it."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app, no_loops
from service.auth import Role
from tests.service.conftest import add_token, settings_for

BODY = {"source_uri": "hf://org/src@" + "0" * 40, "artifact_uri": "hf://org/m@" + "0" * 40 + "/m.gguf",
        "artifact_sha256": "e" * 64}


@pytest.fixture
def api(sqlite_url, tmp_path):
    app = create_app(settings_for(sqlite_url, tmp_path, file_roots=(Path("/models"),)), loops=no_loops)
    tokens = {role: add_token(sqlite_url, role, role.value) for role in (Role.SUBMITTER, Role.AUDITOR)}
    with TestClient(app) as client:
        client.tokens = tokens
        yield client


def _as(api, role: Role) -> dict[str, str]:
    return {"Authorization": f"Bearer {api.tokens[role]}"}


@pytest.mark.parametrize(("request_it", "status", "code"), [
    (lambda api: api.post("/v1/verifications", json=BODY), 401, "auth.unauthenticated"),
    (lambda api: api.post("/v1/verifications", json=BODY, headers=_as(api, Role.AUDITOR)), 403, "auth.forbidden"),
    (lambda api: api.post("/v1/verifications", json=BODY | {"policy": "nonesuch"}, headers=_as(api, Role.SUBMITTER)),
     422, "submission.refused"),
    (lambda api: api.post("/v1/verifications", json=BODY | {"policy": {"version": "mine"}},
                          headers=_as(api, Role.SUBMITTER)), 403, "submission.policy_not_allowed"),
    (lambda api: api.post("/v1/verifications", json=BODY | {"artifact_sha256": "no"},
                          headers=_as(api, Role.SUBMITTER)), 422, "request.invalid"),
    (lambda api: api.get("/v1/verifications", params={"cursor": "forged"}, headers=_as(api, Role.AUDITOR)),
     400, "request.cursor_invalid"),
    (lambda api: api.get("/v1/verifications/" + "0" * 8 + "-0000-4000-8000-" + "0" * 12,
                         headers=_as(api, Role.AUDITOR)), 404, "not_found"),
], ids=["no-token", "wrong-role", "unknown-policy", "inline-policy", "malformed", "forged-cursor", "unknown-id"])
def test_every_refusal_carries_its_code(api, request_it, status, code):
    response = request_it(api)
    assert (response.status_code, response.json()["code"]) == (status, code), response.text
    assert response.json()["detail"]


def test_a_reused_idempotency_key_is_a_conflict_with_its_code(api):
    headers = _as(api, Role.SUBMITTER) | {"Idempotency-Key": "k"}
    assert api.post("/v1/verifications", json=BODY, headers=headers).status_code == 202
    again = api.post("/v1/verifications", json=BODY | {"artifact_sha256": "f" * 64}, headers=headers)
    assert (again.status_code, again.json()["code"]) == (409, "submission.idempotency_conflict")
