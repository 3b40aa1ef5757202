"""schemathesis against the service's own OpenAPI document, in process (ASGI, no network server):
every operation, as every role and with no token, with schema-conforming and with negative (schema-
violating) data, path ids both generated and real, and with hostile strings: schema-conforming data whose
every string (body, query, path) is salted with a NUL, `%00`, a lone surrogate or whitespace (issue 22:
each was a 500 somewhere). Checks: no 5xx, every response conforms to the documented schema, and negative
data is refused with a 4xx. Bounded: CONVGATE_SCHEMATHESIS_EXAMPLES
examples per operation, mode, id kind and caller (default 10: about 1,000 requests in ~40 s on 2 cores)."""

from __future__ import annotations

import itertools
import json
import os
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, response_schema_conformance

from engine.policy import Policy
from service.api.app import create_app, no_loops
from service.auth import Role
from service.persistence import repository
from service.persistence.db import transaction
from tests.service.conftest import add_token, settings_for

EXAMPLES = int(os.environ.get("CONVGATE_SCHEMATHESIS_EXAMPLES", "10"))
CALLERS: list[Role | None] = [*Role, None]  # None: no token at all
SHA = "e" * 64
# What a string may be salted with: in a JSON body anything, in a URL only what UTF-8 can carry (a lone
# surrogate cannot be percent-encoded, so no client can send one there).
URL_SALT = ["\x00", "%00", "a%00b", " ", "\n", "\u2028", "\x7f"]
BODY_SALT = [*URL_SALT, "\ud800", "\udfff", "x\udbff"]
HOSTILE = "hostile"
GOOD = {"source_uri": "file:///models/m", "artifact_uri": "file:///models/m.gguf", "artifact_sha256": SHA}
SEEDS = {"POST /v1/verifications": [GOOD, GOOD | {"release_files": ["file:///models/r.json"]},
                                    GOOD | {"policy": Policy().model_dump(mode="json")},
                                    GOOD | {"text_sets": {"english": ["a text"]}}]}


def _salted(value: Any, salt: Iterator[str], target: int, seen: list[int]) -> Any:
    """`value` with a salt appended to its `target`-th string (counted modulo their number), or to every
    string when `target` < 0; object keys are left alone (they name the fields)."""
    if isinstance(value, str):
        seen[0] += 1
        return value + next(salt) if target < 0 or seen[0] - 1 == target else value
    if isinstance(value, list):
        return [_salted(item, salt, target, seen) for item in value]
    if isinstance(value, dict):
        return {key: _salted(item, salt, target, seen) for key, item in value.items()}
    return value


def _strings(value: Any) -> int:
    if isinstance(value, str):
        return 1
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return sum(_strings(item) for item in items)


def _hostile(case, seed: dict[str, Any] | None, target: int, body_salt: list[str], url_salt: list[str]):
    """The schema-conforming case (or, for a submission, a known-good body) with a hostile string: one of
    the body's strings salted, and every query and path parameter. A JSON body goes out as ASCII JSON
    (`\\ud800` escapes: the client's UTF-8 encoder would refuse the character itself)."""
    body = seed if seed is not None and isinstance(case.body, dict) else case.body
    if isinstance(body, dict | list | str):
        json_body = "json" in (case.media_type or "")
        index = target % max(_strings(body), 1)
        salted = _salted(body, itertools.cycle(body_salt if json_body else url_salt), index, [0])
        case.body = json.dumps(salted, ensure_ascii=True).encode() if json_body else salted
    if case.query:
        case.query = _salted(case.query, itertools.cycle(url_salt), -1, [0])
    if case.path_parameters:
        case.path_parameters = _salted(case.path_parameters, itertools.cycle(url_salt), -1, [0])
    return case


def hostile_strategy(strategy, seeds: list[dict[str, Any]]):
    return st.builds(_hostile, strategy, st.sampled_from([None, *seeds]), st.integers(0, 63),
                     st.lists(st.sampled_from(BODY_SALT), min_size=1, max_size=4),
                     st.lists(st.sampled_from(URL_SALT), min_size=1, max_size=3))


@pytest.fixture
def app_with_data(sqlite_url, tmp_path):
    """The app on the embedded default with a token per role, one verification with a verdict and one queued."""
    settings = settings_for(sqlite_url, tmp_path, allow_file_uris=True, file_roots=(Path("/models"),),
                            metrics_public=False)
    app = create_app(settings, loops=no_loops)
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
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE, HOSTILE):
                checks = [not_a_server_error, response_schema_conformance]
                if mode == GenerationMode.NEGATIVE:
                    checks.append(negative_data_rejection)
                for path_parameters in id_variants:
                    key = f"{operation.label} | {caller or 'anonymous'} | {getattr(mode, 'value', mode)}"
                    strategy = operation.as_strategy(
                        generation_mode=GenerationMode.POSITIVE if mode == HOSTILE else mode, headers=headers,
                        path_parameters=path_parameters)
                    if mode == HOSTILE:
                        strategy = hostile_strategy(strategy, SEEDS.get(operation.label, []))
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
