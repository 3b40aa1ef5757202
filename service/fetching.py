"""The service's side of the edge: the URI and fetch policies built from settings, and how a
submission's URIs are stored so that their secrets never show.

A submitted URI may carry a secret (a presigned query string, `user:pass@`). The stored request's
`source_uri`, `artifact_uri`, `release_files`, `imatrix_uri` and the signatures' URIs — and so the
columns, the API, the report, events and logs — hold only the redacted form. The worker still needs
the real URI to fetch, so the originals are kept under `request["fetch_uris"]` (only when they
differ from the redacted form): a key no endpoint returns and no event or log quotes. It is plain
JSON in the database, readable by whoever can read that table; the API is not such a reader.
"""

from __future__ import annotations

from typing import Any

from edge.download import FetchPolicy
from edge.inputs import InputUris
from edge.redact import redact_uri
from edge.retry import RetryPolicy
from edge.uri_policy import UriPolicy
from service.config import Settings

FETCH_URIS = "fetch_uris"


def uri_policy(settings: Settings) -> UriPolicy:
    return UriPolicy(allow_file=settings.allow_file_uris, file_roots=settings.file_roots,
                     allowed_hosts=settings.allowed_hosts, allow_private_addresses=settings.allow_private_addresses,
                     trusted_hosts=settings.trusted_hosts)


def fetch_policy(settings: Settings) -> FetchPolicy:
    retry = RetryPolicy(attempts=settings.fetch_attempts, backoff_s=settings.fetch_backoff_seconds,
                        max_backoff_s=settings.fetch_max_backoff_seconds)
    return FetchPolicy(uris=uri_policy(settings), hf_endpoint=settings.hf_endpoint, retry=retry)


def stored_request(request: dict[str, Any]) -> dict[str, Any]:
    """The request as stored: URIs redacted, the originals under FETCH_URIS when they differ."""
    originals = {"source_uri": request["source_uri"], "artifact_uri": request["artifact_uri"],
                 "release_files": list(request.get("release_files") or [])}
    shown = {"source_uri": redact_uri(originals["source_uri"]), "artifact_uri": redact_uri(originals["artifact_uri"]),
             "release_files": [redact_uri(uri) for uri in originals["release_files"]]}
    for key in ("imatrix_uri", "source_signature_uri", "artifact_signature_uri"):
        if request.get(key) is not None:
            originals[key] = request[key]
            shown[key] = redact_uri(request[key])
    stored = request | shown
    if shown != originals:
        stored[FETCH_URIS] = originals
    return stored


def public_request(stored: dict[str, Any]) -> dict[str, Any]:
    """The stored request without the secret-bearing originals (what identity hashes and displays use)."""
    return {key: value for key, value in stored.items() if key != FETCH_URIS}


def input_uris(stored: dict[str, Any]) -> InputUris:
    """The URIs the worker fetches: the originals when the stored ones were redacted."""
    uris = stored.get(FETCH_URIS) or stored
    return InputUris(source=uris["source_uri"], artifact=uris["artifact_uri"],
                     release_files=tuple(uris.get("release_files") or ()), imatrix=uris.get("imatrix_uri"),
                     source_signature=uris.get("source_signature_uri"),
                     artifact_signature=uris.get("artifact_signature_uri"))
