"""schemathesis against the service's own OpenAPI document, in process (ASGI, no network server):
every operation, as every role and with no token, with schema-conforming and with negative (schema-
violating) data, path ids both generated and real. Checks: no 5xx, every response conforms to the
documented schema, and negative data is refused with a 4xx. Bounded: CONVGATE_SCHEMATHESIS_EXAMPLES
examples per operation, mode, id kind and caller (default 10: about 1,000 requests in ~40 s on 2 cores)."""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import hypothesis
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, response_schema_conformance

from service.api.app import create_app
from service.auth import Role
from service.persistence import repository
from service.persistence.db import transaction
from tests.service.conftest import add_token, settings_for

EXAMPLES = int(os.environ.get("CONVGATE_SCHEMATHESIS_EXAMPLES", "10"))
CALLERS: list[Role | None] = [*Role, None]  # None: no token at all
SHA = "e" * 64


@pytest.fixture
def app_with_data(sqlite_url, tmp_path):
    """The app on the embedded default with a token per role, one verification with a verdict and one queued."""
    settings = settings_for(sqlite_url, tmp_path, file_roots=(Path("/models"),), metrics_public=False)
    app = create_app(settings, run_dispatcher=False)
    tokens = {role: add_token(sqlite_url, role, f"{role.value}-st") for role in Role}
    body = {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "artifact_sha256": SHA}
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {tokens[Role.SUBMITTER]}"}
        done, queued = (client.post("/v1/verifications", json=body | {"texts": [name]}, headers=headers).json()["id"]
                        for name in ("done", "queued"))
    report = {"verdict": "GO", "blockers": [], "gates": {"storage": {"status": "passed", "seconds": 1.0}},
              "policy": {"values": {"version": "2026.11-2"}, "sha256": "p" * 64},
              "artifact": {"uri": body["artifact_uri"], "sha256": SHA, "size": 1},
              "files": [{"uri": body["artifact_uri"], "sha256": SHA, "size": 1}], "not_verified": [],
              "environment": {}, "timings": {}}
    with transaction(app.state.session_factory) as session:
        attempt = repository.claim(session, done, "st").attempt
        repository.start_attempt(session, done, "st", attempt=attempt)
        assert repository.record_verdict(session, done, attempt, report, worker="st")
    return app, tokens, [done, queued]


def _runner(operation, strategy, checks: list[Callable], examples: Counter, key: str) -> Callable[[], None]:
    @hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                         phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @hypothesis.given(case=strategy)
    def run(case) -> None:
        examples[key] += 1
        response = case.call()
        case.validate_response(response, checks=checks)

    return run


def test_every_operation_every_role_positive_and_negative(app_with_data):
    app, tokens, ids = app_with_data
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 16, [op.label for op in operations]
    examples: Counter[str] = Counter()
    failures: list[str] = []
    for operation in operations:
        id_variants: list[dict[str, str] | None] = [None]
        if "{verification_id}" in operation.path:
            id_variants += [{"verification_id": verification_id} for verification_id in ids]
        for caller in CALLERS:
            headers = {} if caller is None else {"Authorization": f"Bearer {tokens[caller]}"}
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                checks = [not_a_server_error, response_schema_conformance]
                if mode == GenerationMode.NEGATIVE:
                    checks.append(negative_data_rejection)
                for path_parameters in id_variants:
                    key = f"{operation.label} | {caller or 'anonymous'} | {mode.value}"
                    strategy = operation.as_strategy(generation_mode=mode, headers=headers,
                                                     path_parameters=path_parameters)
                    try:
                        _runner(operation, strategy, checks, examples, key)()
                    except hypothesis.errors.Unsatisfiable:
                        continue  # e.g. no negative form of an operation without parameters
                    except (Exception, BaseExceptionGroup) as exc:
                        failures.append(f"{key} ids={path_parameters}: {type(exc).__name__}: "
                                        + "".join(traceback.format_exception_only(exc))[:1500])
    per_operation = Counter(key.split(" | ")[0] for key in examples.elements())
    print(f"\nschemathesis: {len(operations)} operations, {len(CALLERS)} callers, {examples.total()} requests")
    for label, count in sorted(per_operation.items()):
        print(f"  {count:5d}  {label}")
    assert {key.split(" | ")[0] for key in examples} == {op.label for op in operations}
    assert not failures, "\n\n".join(failures)
