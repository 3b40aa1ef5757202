"""The engine's one error root. Library errors are translated into these at the boundary."""

from __future__ import annotations


class ConvgateError(Exception):
    """Base of every error the engine raises on purpose."""


class ReferenceMissingError(ConvgateError):
    """A reference implementation (libggml, transformers, ...) needed by a check is unavailable."""


class CodedError(ConvgateError):
    """An input defect that becomes a blocker: `code` is from the blocker table, `why` says what."""

    def __init__(self, code: str, why: str, tensor: str | None = None) -> None:
        super().__init__(why)
        self.code = code
        self.why = why
        self.tensor = tensor


class UnsupportedTypeError(ConvgateError):
    """No independent reader exists for a tensor type (gguf-py cannot dequantize it)."""


class SourceError(CodedError):
    """The source model cannot be used; `code` is a `source.*` blocker code."""


class UsageError(ConvgateError):
    """The request itself is unusable (missing path, bad policy file): exit code 2, not a verdict."""
