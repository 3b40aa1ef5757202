"""convgate's one error root, for the engine, the edge and the service alike (they import the engine,
never the other way). Library errors are translated into these at the boundary.

Every error has a stable `code` in the blocker table's dotted style: an input defect carries the
blocker's own code (`CodedError`); anything else its class's. Control flow, logs, the API's error
bodies and tests match on the class or the code, never on the message, which is for people."""

from __future__ import annotations


class ConvgateError(Exception):
    """Base of every error convgate raises on purpose."""

    code: str = "convgate.error"


class ReferenceMissingError(ConvgateError):
    """A reference implementation (libggml, transformers, ...) needed by a check is unavailable."""

    code = "engine.reference_missing"


class CodedError(ConvgateError):
    """An input defect that becomes a blocker: `code` is from the blocker table, `why` says what."""

    def __init__(self, code: str, why: str, tensor: str | None = None) -> None:
        super().__init__(why)
        self.code = code
        self.why = why
        self.tensor = tensor


class UnsupportedTypeError(ConvgateError):
    """No independent reader exists for a tensor type (gguf-py cannot dequantize it)."""

    code = "engine.unsupported_type"


class SourceError(CodedError):
    """The source model cannot be used; `code` is a `source.*` blocker code."""


class UsageError(ConvgateError):
    """The request itself is unusable (missing path, bad policy file): exit code 2, not a verdict."""

    code = "request.unusable"
