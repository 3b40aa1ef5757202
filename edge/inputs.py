"""The edges' one call: fetch a verification's inputs, then run the pure engine on local files.

A source that cannot be had is `SourceUnavailableError` (no verdict possible); an artifact, release
file, importance matrix or publisher's signature refused or answered definitively (404, digest
mismatch, outside the roots) is a NO-GO with its blocker; a transient failure raises
`TransientFetchError` so the attempt ends without a verdict. The report names the artifact by its redacted URI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge.download import FetchPolicy
from edge.errors import FetchError
from edge.fetch import fetch_artifact, fetch_source, fetch_split_artifact, local_file, named_local_split, one_file
from edge.redact import redact_uri
from edge.store import ContentStore
from engine.blockers import Blocker
from engine.gates.storage.parts import StoragePart
from engine.policy import Policy
from engine.progress import Progress, no_progress
from engine.report import Report
from engine.verification import LocalInputs, SourceUnavailableError, VerifyRequest, unfetched, verify, verify_shard


@dataclass(frozen=True, kw_only=True)
class InputUris:
    """Where a verification's files are, as submitted (possibly secret-bearing: never displayed)."""

    source: str
    artifact: str
    release_files: tuple[str, ...] = ()
    imatrix: str | None = None  # the importance matrix the artifact was quantized with
    source_signature: str | None = None  # the publishers' OpenSSF Model Signing signatures
    artifact_signature: str | None = None


def _release_files(uris: InputUris, fetch: FetchPolicy) -> tuple[Path, ...]:
    """Release files are local (`file://`): the same root check as at submission."""
    return tuple(local_file(uri, fetch, must_exist=False) for uri in uris.release_files)


def _imatrix(uris: InputUris, request: VerifyRequest, store: ContentStore, fetch: FetchPolicy) -> Path | None:
    """Fetched like the artifact (same URI policy, digest checked when downloaded)."""
    if uris.imatrix is None:
        return None
    return fetch_artifact(uris.imatrix, request.imatrix_sha256, store, fetch)


def _signature(uri: str | None, expected: str | None, store: ContentStore, fetch: FetchPolicy) -> Path | None:
    """A publisher's signature, fetched like the artifact."""
    return None if uri is None else fetch_artifact(uri, expected, store, fetch)


def _unfetched_signature(of: str, exc: FetchError) -> Blocker:
    """A signature that cannot be had is no evidence: NO-GO under the input's own code."""
    return Blocker(code=f"{of}.signature_invalid", gate="input", why=f"the {of}'s signature: {exc.why}")


def _artifact(uris: InputUris, request: VerifyRequest, store: ContentStore, fetch: FetchPolicy,
              progress: Progress) -> Path:
    """The artifact's local path: a split's first shard with its siblings beside it when the request declares
    the split (every shard's digest) or a local URI names one of its shards, else one file whose name implies
    no shards (`one_file`)."""
    def downloaded(done: int, total: int) -> None:
        progress("download", done, total)

    if len(request.shard_sha256) > 1:
        return fetch_split_artifact(uris.artifact, request.shard_sha256, store, fetch, downloaded)
    if (split := named_local_split(uris.artifact, fetch, store)) is not None:
        return split
    return one_file(fetch_artifact(uris.artifact, request.expected_sha256, store, fetch, downloaded), store)


def fetch_inputs(request: VerifyRequest, uris: InputUris, policy: Policy, fetch: FetchPolicy,
                 store: ContentStore, progress: Progress = no_progress) -> LocalInputs | Report:
    """Every input fetched by digest into the store, or the NO-GO report of the one that could not be."""
    try:
        source = fetch_source(uris.source, store, fetch)
    except FetchError as exc:
        raise SourceUnavailableError(exc.why) from exc
    try:
        artifact = _artifact(uris, request, store, fetch, progress)
        release = _release_files(uris, fetch)
    except FetchError as exc:
        return unfetched(request, policy, Blocker(code=exc.code, gate="input", why=exc.why))
    try:
        imatrix = _imatrix(uris, request, store, fetch)
    except FetchError as exc:
        code = "imatrix.sha256_mismatch" if exc.code == "artifact.sha256_mismatch" else "imatrix.unavailable"
        return unfetched(request, policy, Blocker(code=code, gate="input", why=f"importance matrix: {exc.why}"))
    try:
        source_signature = _signature(uris.source_signature, request.source_signature_sha256, store, fetch)
    except FetchError as exc:
        return unfetched(request, policy, _unfetched_signature("source", exc))
    try:
        artifact_signature = _signature(uris.artifact_signature, request.artifact_signature_sha256, store, fetch)
    except FetchError as exc:
        return unfetched(request, policy, _unfetched_signature("artifact", exc))
    return LocalInputs(source=source, source_uri=redact_uri(uris.source), artifact=artifact,
                       artifact_uri=redact_uri(uris.artifact), release_files=release,
                       imatrix=imatrix, imatrix_uri=redact_uri(uris.imatrix) if uris.imatrix else None,
                       source_signature=source_signature, artifact_signature=artifact_signature,
                       source_signature_uri=redact_uri(uris.source_signature) if uris.source_signature else None,
                       artifact_signature_uri=redact_uri(uris.artifact_signature) if uris.artifact_signature else None)


def fetch_and_verify(request: VerifyRequest, uris: InputUris, policy: Policy, fetch: FetchPolicy,
                     store: ContentStore, progress: Progress = no_progress) -> Report:
    inputs = fetch_inputs(request, uris, policy, fetch, store, progress)
    return inputs if isinstance(inputs, Report) else verify(request, inputs, policy, progress)


def fetch_and_verify_shard(request: VerifyRequest, uris: InputUris, policy: Policy, fetch: FetchPolicy,
                           store: ContentStore, progress: Progress, shard: int,
                           shards: int) -> tuple[Report, StoragePart | None]:
    """One shard of a verification split over pods: (its report, its part of gate 1); no part when the
    run stopped before gate 1 (the report is then the verification's whole NO-GO)."""
    inputs = fetch_inputs(request, uris, policy, fetch, store, progress)
    if isinstance(inputs, Report):
        return inputs, None
    return verify_shard(request, inputs, policy, progress, shard, shards)
