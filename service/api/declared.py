"""Parameters a route validates itself, still declared as FastAPI declares its own: the same 422, the same
OpenAPI document.

Why a route would: on the two busiest routes (the submission and the auditor's query) FastAPI's resolution of
declared parameters and dependencies cost more CPU than the work they guard (scripts/bench_api.py, py-spy: a
third of the auditor query's), and it runs before the endpoint, so the bearer token could not be looked up on
the connection the work then uses. Those routes take the request and validate the rest with one pydantic
model, refused only once the caller has been looked up (a bad token is a 401, as FastAPI's dependencies made
it, whatever else is wrong: the submission looks its token up in the statement that stores it, and a
refusal waits for that lookup), as FastAPI refuses a parameter (`RequestValidationError`, `loc` starting "query",
"header" or "body": one 422 shape for every route, `service.api.errors`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

SCHEMA_REF = "#/components/schemas/{model}"
M = TypeVar("M", bound=BaseModel)


def refused(where: str, exc: ValidationError, *prefix: str) -> RequestValidationError:
    """`exc` as FastAPI's own refusal of a parameter: every error's location starts with `where`."""
    return RequestValidationError([{**error, "loc": (where, *prefix, *error["loc"])}
                                   for error in exc.errors(include_url=False)])


def query(model: type[M], values: Mapping[str, str]) -> M:
    """The query string's values as `model` (a name given twice: its last value, as FastAPI reads a scalar;
    names the model does not declare are ignored, as FastAPI ignores them)."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise refused("query", exc) from exc


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """`model`'s fields as the OpenAPI query parameters FastAPI would have declared for them (for a route's
    `openapi_extra`); the types they name are added to the document's components by `documented`."""
    schema = model.model_json_schema(ref_template=SCHEMA_REF, mode="validation")
    parameters = []
    for name, declared in schema["properties"].items():
        # FastAPI leaves an optional parameter's null default out of its schema
        field = {key: value for key, value in declared.items() if key != "default" or value is not None}
        if "$ref" not in field:  # FastAPI titles every schema but a bare reference; pydantic not a nullable one
            field.setdefault("title", name.replace("_", " ").title())
        described = {"description": field["description"]} if "description" in field else {}
        parameters.append({"name": name, "in": "query", "required": name in schema.get("required", ()),
                           "schema": field, **described})
    return parameters


def documented(app: FastAPI, *bodies: type[BaseModel],
               queries: tuple[type[BaseModel], ...] = ()) -> Callable[[], dict[str, Any]]:
    """The app's OpenAPI document with `bodies` (request bodies routes validate themselves) among its
    components, and the types they and `queries` (`query_parameters`) name."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for model in (*bodies, *queries):
                schema = model.model_json_schema(ref_template=SCHEMA_REF, mode="validation")
                for name, definition in schema.pop("$defs", {}).items():
                    schemas.setdefault(name, definition)
                if model in bodies:
                    schemas.setdefault(model.__name__, schema)
            app.openapi_schema = document
        return app.openapi_schema
    return openapi
