"""One way to read the JSON files of a source model: bounded, and never a crash on hostile text.

`json.loads` lets three kinds of hostile text escape as exceptions nobody expects: deep nesting
(`RecursionError`), an integer of thousands of digits (`ValueError` from Python's int-string limit)
and invalid UTF-8. Each becomes a `SourceError` naming the file. Nesting is also capped well below
the interpreter's limit, so code that later walks the value recursively cannot overflow either.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

from engine.errors import SourceError

MAX_JSON_DEPTH = 64

# Read off the text rather than by walking the parsed value: a real tokenizer.json holds hundreds of
# thousands of strings, and walking them cost seconds per read. Strings are removed first (a bracket
# inside one is not nesting); in text that is valid UTF-8 a lone surrogate can only come from a \uD800-\uDFFF
# escape, so the value is walked only when such an escape appears.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_depth(value: Any) -> int:
    """Containers nested in a parsed JSON value (a scalar is 0, `[]` is 1), computed without recursion.

    Raises ValueError on a string holding a lone surrogate (`"\\ud800"` is valid JSON syntax but
    no valid Unicode: the Rust readers of safetensors and tokenizer.json refuse it, and it cannot
    be written back out as UTF-8)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth + 1)
        if isinstance(node, dict):
            if not all(_encodable(key) for key in node):
                raise ValueError("a key holds a lone surrogate")
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
        elif isinstance(node, str) and not _encodable(node):
            raise ValueError("a string holds a lone surrogate")
    return deepest


def text_depth(text: str) -> int:
    """Containers nested in valid JSON text (a scalar is 0, `[]` is 1): brackets outside strings."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_json(
    raw: bytes | str, what: str, code: str = "source.bad_file",
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """Parse `raw` (UTF-8 bytes or text) or raise `SourceError(code)` saying what is wrong with `what`."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(text, object_pairs_hook=object_pairs_hook)
    except UnicodeDecodeError as exc:
        raise SourceError(code, f"{what} is not valid UTF-8") from exc
    except RecursionError as exc:
        raise SourceError(code, f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:  # JSONDecodeError, and the int-string conversion limit
        raise SourceError(code, f"{what} is not valid JSON: {str(exc)[:200]}") from exc
    if text_depth(text) > MAX_JSON_DEPTH:
        raise SourceError(code, f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    if not _encodable(text) or _SURROGATE_ESCAPE.search(text):
        try:
            json_depth(value)
        except ValueError as exc:
            raise SourceError(code, f"{what} is not valid Unicode: {exc}") from exc
    return value


__all__ = ["MAX_JSON_DEPTH", "json_depth", "parse_json", "text_depth"]
