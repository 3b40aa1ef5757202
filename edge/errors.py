"""The edge's two outcomes of a failed fetch, classified by behaviour, not by HTTP status.

`FetchError` is a definitive answer about the input (404/410, a digest mismatch, a refusal by the
URI policy): it becomes a NO-GO blocker. `TransientFetchError` (connection reset, timeout, 5xx, 429)
means "not now": the attempt ends without a verdict and the dispatcher retries it later.
Both messages are redacted when built, so no secret travels inside an exception.
"""

from __future__ import annotations

from edge.redact import redact
from engine.errors import CodedError, ConvgateError


class FetchError(CodedError):
    """The URI cannot be turned into a verified local file; `code` is a blocker code."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(code, redact(why))


class TransientFetchError(ConvgateError):
    """The fetch failed for a reason that may pass; retried with backoff, then no verdict."""

    code = "fetch.transient"

    def __init__(self, why: str) -> None:
        super().__init__(redact(why))
        self.why = redact(why)
