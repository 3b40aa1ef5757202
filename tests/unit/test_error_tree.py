"""One error tree: every exception class convgate defines derives from `ConvgateError` and has a stable
code of its own, and no code decides anything by reading an error's message or probing it for an
attribute (tests/service/test_error_codes.py checks that the API's error bodies carry the codes)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

from engine.errors import CodedError, ConvgateError

ROOT = Path(__file__).parents[2]
PACKAGES = ("engine", "edge", "service")
CODE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, f"{package}.")
                  if not info.name.endswith("__main__")]
    return names


def _defined_errors() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return list(found.values())


ERRORS = _defined_errors()


def test_the_tree_was_found() -> None:
    names = {error.__name__ for error in ERRORS}
    assert {"SubmissionError", "FetchError", "KubeError", "UriRefusedError", "ShardsDoNotMergeError"} <= names


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: f"{error.__module__}.{error.__qualname__}")
def test_every_error_derives_from_the_root_with_a_code_of_its_own(error: type[BaseException]) -> None:
    assert issubclass(error, ConvgateError), f"{error.__qualname__} is outside the tree: {error.__mro__}"
    if issubclass(error, CodedError):
        return  # its code is the blocker's, given per instance and checked against the blocker table
    assert "code" in vars(error), f"{error.__qualname__} inherits its parent's code"
    assert CODE.fullmatch(error.code), error.code


def test_codes_are_unique() -> None:
    codes = [error.code for error in ERRORS if issubclass(error, ConvgateError) and "code" in vars(error)]
    assert len(codes) == len(set(codes)), sorted(code for code in codes if codes.count(code) > 1)


def _reads_a_message_or_probes(node: ast.AST) -> bool:
    """`... in str(exc)`, `str(exc).startswith(...)`, or `getattr(exc, ...)` / `hasattr(exc, ...)`."""
    if isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
        return any(isinstance(side, ast.Call) and isinstance(side.func, ast.Name) and side.func.id == "str"
                   and side.args and isinstance(side.args[0], ast.Name) and side.args[0].id in {"exc", "error", "e"}
                   for side in node.comparators)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"getattr", "hasattr"}:
        return bool(node.args) and isinstance(node.args[0], ast.Name) and node.args[0].id in {"exc", "error", "e"}
    return False


def test_no_control_flow_reads_an_errors_message_or_probes_its_attributes() -> None:
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if _reads_a_message_or_probes(node):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")  # type: ignore[attr-defined]
    assert not found, found
