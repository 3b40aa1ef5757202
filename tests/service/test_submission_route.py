"""POST /v1/verifications validates its own body and header (service/api/submission.py): what FastAPI's
declarations did must still hold. The token before anything else, the refusals in FastAPI's 422 shape with
their location, and the body and header in the OpenAPI document."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app, no_loops
from service.auth import Role
from tests.service.conftest import add_token, settings_for

SHA = "d" * 64
HF_SOURCE = "hf://org/src@" + "0" * 40


@pytest.fixture
def api(sqlite_url, tmp_path):
    app = create_app(settings_for(sqlite_url, tmp_path, dispatcher="none"), loops=no_loops)
    submitter = add_token(sqlite_url, Role.SUBMITTER, "submitter-1")
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {submitter}"
        yield client


def body(**overrides: Any) -> dict[str, Any]:
    return {"source_uri": HF_SOURCE, "artifact_uri": HF_SOURCE + "/m.gguf", "artifact_sha256": SHA, **overrides}


@pytest.mark.parametrize("content", [b"{not json", b'{"source_uri": 1}', b""])
def test_a_bad_token_is_a_401_whatever_the_body_and_header(api, content):
    answer = api.post("/v1/verifications", content=content,
                      headers={"Authorization": "Bearer nope", "Idempotency-Key": "x" * 500})
    assert answer.status_code == 401
    assert answer.json()["code"] == "auth.unauthenticated"


def test_a_role_that_may_not_submit_is_a_403_before_the_body(api, sqlite_url):
    auditor = add_token(sqlite_url, Role.AUDITOR, "auditor-1")
    answer = api.post("/v1/verifications", content=b"{", headers={"Authorization": f"Bearer {auditor}"})
    assert answer.status_code == 403


@pytest.mark.parametrize(("content", "location"), [
    (b"{not json", ["body"]),
    (b'{"source_uri": "hf://org/src@' + b"0" * 40 + b'"}', ["body", "artifact_uri"]),
    (b'{"source_uri": 1, "artifact_uri": "hf://a@b", "artifact_sha256": "' + SHA.encode() + b'"}',
     ["body", "source_uri"]),
])
def test_a_malformed_body_is_a_422_located_in_the_body(api, content, location):
    answer = api.post("/v1/verifications", content=content, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422
    found = answer.json()
    assert found["code"] == "request.invalid"
    assert found["detail"][0]["loc"][:len(location)] == location
    assert all("input" not in error for error in found["detail"])  # never echoed (a surrogate cannot be)


@pytest.mark.parametrize("key", ["x" * 201, "tab\there"])
def test_a_malformed_idempotency_key_is_a_422_located_in_the_header(api, key):
    answer = api.post("/v1/verifications", json=body(), headers={"Idempotency-Key": key})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["header", "Idempotency-Key"]


def test_a_valid_submission_is_accepted_and_its_key_repeats_it(api):
    first = api.post("/v1/verifications", json=body(), headers={"Idempotency-Key": "k-1"})
    again = api.post("/v1/verifications", json=body(), headers={"Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    assert first.headers["Location"] == f"/v1/verifications/{first.json()['id']}"


def test_the_openapi_document_names_the_body_and_the_header(api):
    document = api.get("/openapi.json").json()
    operation = document["paths"]["/v1/verifications"]["post"]
    reference = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schemas = document["components"]["schemas"]
    submit = schemas[reference.rsplit("/", 1)[1]]
    assert set(submit["required"]) == {"source_uri", "artifact_uri", "artifact_sha256"}
    assert "Policy" in schemas and "LabelledSetDocument" in schemas  # what the body's schema refers to
    assert [(p["name"], p["in"]) for p in operation["parameters"]] == [("Idempotency-Key", "header")]
    assert {"maxLength": 200} .items() <= operation["parameters"][0]["schema"]["anyOf"][0].items()


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_a_body_not_declared_json_is_refused_as_fastapi_refuses_it(api, content_type):
    """FastAPI parses a body as JSON only under a JSON media type (its strict content type): a cross-site form or
    text/plain POST, which a browser sends without a preflight, is never read as a submission."""
    import json

    headers = {"Content-Type": content_type} if content_type else {}
    answer = api.post("/v1/verifications", content=json.dumps(body()).encode(), headers=headers)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body"]


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "application/vnd.convgate+json"])
def test_a_json_media_type_is_read(api, content_type):
    import json

    answer = api.post("/v1/verifications", content=json.dumps(body()).encode(), headers={"Content-Type": content_type})
    assert answer.status_code == 202
