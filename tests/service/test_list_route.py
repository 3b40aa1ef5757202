"""GET /v1/verifications validates its own query (`service.api.declared`), after the caller is looked up: what
FastAPI's declared parameters did must still hold, on both databases: the 401 before any parameter, the 422 in
FastAPI's shape, the last of a repeated value, unknown names ignored, and the same OpenAPI parameters."""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import FastAPI, Query
from pydantic import BaseModel, Field
from sqlalchemy import update

from service.api import declared
from service.auth import Role
from service.lifecycle import State
from service.persistence import driver
from service.persistence.db import make_engine
from service.persistence.models import Verification
from service.schemas import ListQuery
from tests.service.conftest import add_token

SHA = "a" * 64


@pytest.fixture
def api(api_per_role):
    """Two verifications, of two artifacts, by the submitter."""
    for artifact in (SHA, "b" * 64):
        body = {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "artifact_sha256": artifact}
        response = api_per_role.post("/v1/verifications", json=body,
                                     headers={"Authorization": f"Bearer {api_per_role.tokens[Role.SUBMITTER]}"})
        assert response.status_code == 202, response.text
    return api_per_role


def listed(api, params, token: str | None) -> tuple[int, dict]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    response = api.get("/v1/verifications", params=params, headers=headers)
    return response.status_code, response.json()


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_a_bad_token_is_a_401_before_any_parameter_is_looked_at(api, token):
    assert listed(api, {"limit": "0", "state": "sleeping"}, token)[0] == 401


@pytest.mark.parametrize(("params", "where"), [
    ({"limit": "0"}, ["query", "limit"]), ({"limit": "many"}, ["query", "limit"]),
    ({"state": "sleeping"}, ["query", "state"]), ({"since": "tuesday"}, ["query", "since"]),
    ({"artifact_sha256": "A" * 64}, ["query", "artifact_sha256"]), ({"policy": "p" * 64}, ["query", "policy"]),
])
def test_a_bad_parameter_is_refused_as_fastapi_refuses_one(api, params, where):
    status, answer = listed(api, params, api.tokens[Role.AUDITOR])
    assert status == 422
    assert answer["code"] == "request.invalid" and answer["detail"][0]["loc"] == where
    assert "url" not in answer["detail"][0]  # FastAPI's errors link no documentation page


def test_a_repeated_parameter_counts_its_last_value_and_unknown_names_are_ignored(api):
    status, answer = listed(api, [("artifact_sha256", "b" * 64), ("artifact_sha256", SHA), ("colour", "red"),
                                  ("limit", "1")], api.tokens[Role.AUDITOR])
    assert status == 200 and [item["artifact_sha256"] for item in answer["items"]] == [SHA]


def test_a_submitter_reads_only_its_own_whatever_it_asks(api):
    other = add_token(api.url, Role.SUBMITTER, "someone-else")
    status, answer = listed(api, {"submitted_by": api.names[Role.SUBMITTER]}, other)
    assert (status, answer["items"]) == (200, [])
    status, answer = listed(api, {}, api.tokens[Role.SUBMITTER])
    assert (status, len(answer["items"])) == (200, 2)


class Required(BaseModel):
    """A query with what ListQuery lacks: a required parameter, and references named with more than a word."""

    worker_state: State
    previous_state: State | None = None
    page_size: int = Field(5, ge=1)


@pytest.mark.parametrize("model", [ListQuery, Required])
def test_the_document_declares_the_parameters_fastapi_would_declare(model):
    """`declared.query_parameters` against FastAPI's own rendering of the same model as query parameters."""
    async def probe(query: BaseModel) -> None:
        return None

    probe.__annotations__ = {"query": Annotated[model, Query()], "return": None}  # the model, not its name
    app = FastAPI()
    app.add_api_route("/probe", probe, methods=["GET"])
    assert declared.query_parameters(model) == app.openapi()["paths"]["/probe"]["get"]["parameters"]


def test_a_request_without_a_token_is_refused_without_taking_a_connection(api, monkeypatch):
    """An unauthenticated flood must not queue on the pool: with no token there is nothing to look up."""
    borrowed = []
    real = driver.borrowed

    def counted(engine):
        borrowed.append(engine)
        return real(engine)

    monkeypatch.setattr(driver, "borrowed", counted)
    assert listed(api, {}, None)[0] == 401
    assert borrowed == []


def test_a_row_whose_stored_policy_is_not_an_object_is_listed_not_a_500(api):
    """A stored policy is what an older release or a hand edit left: the list shows no version for it."""
    engine = make_engine(api.url)
    try:
        with engine.begin() as connection:
            connection.execute(update(Verification).where(Verification.artifact_sha256 == SHA)
                               .values(policy=["not", "an", "object"]))
    finally:
        engine.dispose()
    status, answer = listed(api, {"artifact_sha256": SHA}, api.tokens[Role.AUDITOR])
    assert status == 200 and [item["policy_version"] for item in answer["items"]] == [None]
