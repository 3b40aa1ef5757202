"""Submission, reading and cancelling verifications: stateless logic, session passed in."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import ValidationError
from sqlalchemy.orm import Session

from edge.file_roots import file_uri_path
from edge.redact import redact, redact_uri
from edge.uri_policy import UriRefusedError
from engine.blockers import safe_text
from engine.errors import ConvgateError
from engine.formats.artifact_files import artifact_paths, split_shard_uris
from engine.policy import VERSION_MAX_CHARS, Policy
from service import callbacks, reuse
from service.attestations.oms import publisher_keys
from service.config import INLINE_VERSION_PREFIX, Settings
from service.fetching import stored_request, uri_policy
from service.persistence import driver, repository, submission_insert
from service.persistence.clock import as_utc
from service.persistence.listing import Listed
from service.persistence.models import Verification
from service.schemas import SubmitRequest, VerificationOut

if TYPE_CHECKING:
    import psycopg


class SubmissionError(ConvgateError, ValueError):
    """The submission is invalid (unknown policy, refused URI): HTTP 422."""

    code = "submission.refused"


class IdempotencyConflictError(ConvgateError, ValueError):
    """The idempotency key was used before with a different request: HTTP 409."""

    code = "submission.idempotency_conflict"


class PolicyRefusedError(ConvgateError, PermissionError):
    """An inline policy from a caller whose role may not author policies: HTTP 403."""

    code = "submission.policy_not_allowed"


def _resolve_policy(settings: Settings, requested: str | Policy, may_author: bool) -> tuple[Policy, str]:
    """The thresholds and their origin: `configured:<name>`, or `inline` for a caller allowed to author
    policies, whose version is prefixed so it can never pass for a configured one."""
    if isinstance(requested, Policy):
        if not may_author:
            raise PolicyRefusedError(
                f"inline policies need the role policy-author (or admin); use a configured policy by name: "
                f"{sorted(settings.policies)}")
        return _inline(requested), "inline"
    if requested not in settings.policies:
        raise SubmissionError(f"unknown policy {requested!r}; known: {sorted(settings.policies)}")
    return settings.policies[requested], f"configured:{requested}"


# A configured policy's hash and stored form, by the object's identity: settings hold each configured policy
# for the process's life, and dumping it (its serializer runs Python per field) and hashing it (a canonical JSON
# dump) for every submission held to it was 12% of a submission's CPU. The policy itself is kept beside them,
# so its id is never reused for another object. The stored form is shared by every submission held to that
# policy: it is only ever serialised into a row, never changed; its JSON text, which the driver binds
# (`driver.JsonText`), is encoded once too.
_CONFIGURED: dict[int, tuple[Policy, StoredPolicy]] = {}


@dataclass(frozen=True)
class StoredPolicy:
    """A policy as a row stores it: its hash, its JSON form and that form's text."""

    sha256: str
    value: dict[str, Any]
    text: driver.JsonText


def _stored(policy: Policy, origin: str) -> StoredPolicy:
    """The policy's hash, JSON form and text, remembered for configured policies (an inline one is new with
    every request)."""
    if origin == "inline":
        return _storing(policy)
    known = _CONFIGURED.get(id(policy))
    if known is None or known[0] is not policy:
        known = _CONFIGURED[id(policy)] = (policy, _storing(policy))
    return known[1]


def _storing(policy: Policy) -> StoredPolicy:
    value = policy.model_dump(mode="json")
    return StoredPolicy(policy.sha256(), value, driver.JsonText(json.dumps(value)))


def _inline(requested: Policy) -> Policy:
    """The inline policy as stored: its version prefixed, and validated again, since the worker validates
    what is stored (a version at the length limit would not fit its prefix)."""
    try:
        return Policy.model_validate(requested.model_dump() | {"version": INLINE_VERSION_PREFIX + requested.version})
    except ValidationError as exc:
        raise SubmissionError(f"inline policy version: with its prefix {INLINE_VERSION_PREFIX!r}, at most "
                              f"{VERSION_MAX_CHARS} characters") from exc


def gate1_shards(settings: Settings, body: SubmitRequest) -> int:
    """How many pods gate 1 runs in: ceil(artifact size / gate1_shard_bytes), capped, on a dispatcher that
    can start them together (not the local pool). The size is the submission's, or a file:// artifact's own."""
    kube = settings.kubernetes
    if settings.dispatcher == "local" or kube.max_gate1_shards == 1 or 1 not in body.gates:
        return 1
    size = body.artifact_size
    if size is None and body.artifact_uri.startswith("file://"):  # a split's every shard, beside its first
        paths = artifact_paths(file_uri_path(body.artifact_uri))
        size = sum(path.stat().st_size for path in paths) if all(path.is_file() for path in paths) else None
    return 1 if size is None else max(1, min(kube.max_gate1_shards, math.ceil(size / kube.gate1_shard_bytes)))


@dataclass(frozen=True)
class Admitted:
    """A submission the service may store: its thresholds resolved and every URI it names admitted by the
    URI policy (`admit`). `submit` takes only this, so nothing is stored unchecked."""
    body: SubmitRequest
    policy: Policy
    policy_origin: str
    gate1_shards: int
    trusted_signers: tuple[str, ...] = ()  # the operator's publisher keys (PEM), when the submission needs them


def may_block(body: SubmitRequest) -> bool:
    """Whether admitting `body` waits on something outside the process: DNS for an https:// URI or a
    callback URL, the filesystem for a file:// URI (symlinks resolved, sizes read). Such an admission may
    take as long as a resolver or a mount does, so it never runs on the event loop; an hf:// one is pure."""
    uris = (body.source_uri, body.artifact_uri, body.imatrix_uri, body.source_signature_uri,
            body.artifact_signature_uri, *body.release_files)
    return (body.callback_url is not None or _signed(body)
            or any(uri is not None and not uri.startswith("hf:") for uri in uris))


def admit(settings: Settings, body: SubmitRequest, *, may_author_policies: bool = False) -> Admitted:
    """The thresholds `body` is held to, and every URI it names checked as the worker will check it
    (without touching the files; a host resolved now, and again by the transport when it connects)."""
    policy, policy_origin = _resolve_policy(settings, body.policy, may_author_policies)
    checker = uri_policy(settings)
    try:
        checker.check(body.source_uri, directory=True)
        checker.check(body.artifact_uri)
        for shard in split_shard_uris(body.artifact_uri, len(body.artifact_shard_sha256 or ())):
            checker.check(shard)
        for uri in (body.imatrix_uri, body.source_signature_uri, body.artifact_signature_uri):
            if uri is not None:
                checker.check(uri)
        for uri in body.release_files:
            if not uri.startswith("file://"):
                raise UriRefusedError("release files are file:// URIs")
            checker.check(uri)
    except UriRefusedError as exc:
        raise SubmissionError(redact(str(exc))) from exc
    if body.callback_url is not None:
        try:
            callbacks.check_callback_url(checker, settings, body.callback_url)
        except UriRefusedError as exc:
            raise SubmissionError(f"callback_url: {redact(str(exc))}") from exc
    signers = publisher_keys(settings) if _signed(body) else ()  # none given: no key is needed to refuse it
    return Admitted(body, policy, policy_origin, gate1_shards(settings, body), signers)


def _signed(body: SubmitRequest) -> bool:
    """Whether `body` names a publisher's signature: admitting it reads the operator's publisher keys."""
    return body.source_signature_uri is not None or body.artifact_signature_uri is not None


@dataclass(frozen=True)
class Prepared:
    """A submission's columns as its insert writes them, worked out before any database read: what `store`
    and the driver's plain insert (`insert_plain_by_token`) both write."""
    fresh: bool
    callback_url: str | None
    reuse_key: str | None
    columns: dict[str, Any]  # repository.new_row's keywords, but the callback's and the reuse key
    policy_text: driver.JsonText  # columns["policy"] as the driver binds it

    @property
    def submitter(self) -> str:
        return str(self.columns["submitted_by"])

    @property
    def idempotency_key(self) -> str | None:
        key: str | None = self.columns["idempotency_key"]
        return key

    def by(self, submitter: str) -> Prepared:
        """The same submission as `submitter`'s: one prepared before its caller was known (`BY_TOKEN`) and
        stored by the ORM after all (nothing else in it depends on who submitted it)."""
        return replace(self, columns=self.columns | {"submitted_by": submitter})


def prepare(settings: Settings, submitter: str, admitted: Admitted, idempotency_key: str | None) -> Prepared:
    """The stored request, the policy's stored form and hash, the request's hash and the reuse key."""
    body, policy, policy_origin = admitted.body, admitted.policy, admitted.policy_origin
    unset = {"imatrix_uri", "imatrix_sha256"} if body.imatrix_uri is None else set()  # identity as before
    unset |= {"artifact_size"} if body.artifact_size is None else set()
    unset |= {"artifact_shard_sha256"} if body.artifact_shard_sha256 is None else set()
    unset |= {"labelled_set"} if body.labelled_set is None else set()
    for signed in ("source_signature", "artifact_signature"):
        unset |= {f"{signed}_uri", f"{signed}_sha256"} if getattr(body, f"{signed}_uri") is None else set()
    request: dict[str, Any] = stored_request(body.model_dump(mode="json", exclude={
        "policy", "fresh", "callback_url", *unset}))  # fresh: how to answer, not what was asked
    if admitted.trusted_signers:
        request["trusted_signers"] = list(admitted.trusted_signers)  # the operator's, fixed now like the policy
    if body.callback_url is not None:
        request["callback_url"] = redact_uri(body.callback_url)  # the full URL is its column, never shown
    stored_policy = _stored(policy, policy_origin)
    policy_sha256 = stored_policy.sha256
    # What an Idempotency-Key stands for: the request with its URIs as sent, secrets included (the
    # originals under fetch_uris, kept in the same row), so a repeat that carries a new presigned URL is a
    # 409 rather than the first verification, which would fetch with the old one. A request without
    # secrets hashes as it always did.
    request_sha256 = hashlib.sha256(json.dumps({"request": request, "policy": policy_sha256},
                                               sort_keys=True).encode()).hexdigest()
    if admitted.gate1_shards > 1:
        request["shards"] = admitted.gate1_shards  # a deployment choice, not what was asked: outside the identity
    return Prepared(body.fresh, body.callback_url,
                    reuse.reuse_key(settings, request, policy_sha256),
                    dict(submitted_by=submitter, idempotency_key=idempotency_key, request_sha256=request_sha256,
                         request=request, policy=stored_policy.value, policy_sha256=policy_sha256,
                         max_attempts=settings.max_attempts, policy_origin=policy_origin), stored_policy.text)


def submit(session: Session, settings: Settings, submitter: str, admitted: Admitted,
           idempotency_key: str | None, *, may_read_all: bool = False) -> tuple[Verification, bool]:
    """Store an admitted verification (thresholds fixed now, with their hash); returns it and whether it is
    new. An earlier verdict stands for it only if the submitter may read that verification (`service.reuse`)."""
    return store(session, settings, prepare(settings, submitter, admitted, idempotency_key),
                 may_read_all=may_read_all)


def store(session: Session, settings: Settings, prepared: Prepared, *,
          may_read_all: bool = False) -> tuple[Verification, bool]:
    """`submit` from its prepared columns: the callback's columns, an earlier verdict that may stand for it,
    or its key's earlier verification (the same request, or a 409)."""
    try:
        callback = callbacks.submission_columns(session, prepared.submitter, prepared.callback_url)
    except callbacks.CallbackRefusedError as exc:
        raise SubmissionError(str(exc)) from exc
    verification = reuse.insert_or_reuse(
        session, settings, fresh=prepared.fresh, among=None if may_read_all else prepared.submitter,
        key=prepared.reuse_key, **callback, **prepared.columns)
    if verification is not None:
        return verification, True
    existing = repository.by_idempotency_key(session, prepared.submitter, prepared.idempotency_key or "")
    if existing is None:  # only the idempotency key is unique among what a submission writes
        raise RuntimeError("a submission was refused by the database without a known idempotency key")
    return _same_request(existing, prepared.columns["request_sha256"]), False


def plain(prepared: Prepared) -> bool:
    """Whether storing `prepared` is its insert alone, with no read first: no callback (whose secret is read)
    and no earlier verdict to look for (none can stand for it, or `fresh` was asked)."""
    return prepared.callback_url is None and (prepared.reuse_key is None or prepared.fresh)


# The submitter a submission is prepared with when its insert names its token's (`insert_plain_by_token`)
BY_TOKEN = ""


class Inserted(NamedTuple):
    """What `insert_plain_by_token` found: the token's name and role, and the row written (None when its role
    may not submit or its key was used before)."""

    name: str
    role: str
    row: dict[str, Any] | None


async def insert_plain_by_token(connection: psycopg.AsyncConnection[Any], prepared: Prepared, token_sha256: str,
                                roles: frozenset[str], moment: datetime) -> Inserted | None:
    """A `plain` submission stored by its one statement on the driver (Postgres, `driver.borrowed`), as
    `store` would store it, by the active token `token_sha256` when its role is one of `roles`: the token is
    looked up by the statement that writes the row, which names the token's holder as its submitter (one
    round trip, not two; `submission_insert.insert_as_caller_on_driver`). None when no token is active by that
    digest; else the row written (`queued_out` answers it) or None (`store` answers a used key: 200 or 409)."""
    row = repository.new_row(moment, reuse_key=prepared.reuse_key, **prepared.columns)
    found = await submission_insert.insert_as_caller_on_driver(
        connection, row | {"policy": prepared.policy_text}, token_sha256, roles)
    if found is None:
        return None
    return Inserted(found.name, found.role, row | {"submitted_by": found.name} if found.inserted else None)


def _same_request(existing: Verification, request_sha256: str) -> Verification:
    if existing.request_sha256 != request_sha256:
        raise IdempotencyConflictError("this Idempotency-Key was used for a different request")
    return existing


def cancel(session: Session, verification: Verification, by: str) -> Verification:
    """A conditional write: a verdict (or failure) committed first wins and is what is returned."""
    return repository.cancel(session, verification.id, by) or verification


def _shown(version: object) -> str | None:
    """A stored policy version as text every response can encode: rows an older release accepted may hold
    a lone surrogate (written as its backslash escape) or a non-string."""
    return None if version is None else safe_text(str(version))


def _version(policy: object) -> object:
    """The stored policy's version, when the stored policy is an object at all (a row a hand edit or an older
    release left otherwise is shown without one, not answered with a 500)."""
    return policy.get("version") if isinstance(policy, dict) else None


def to_out(session: Session, verification: Verification, *, with_blockers: bool = True) -> VerificationOut:
    blockers = None
    if with_blockers and verification.verdict_result is not None:
        verdict = repository.verdict_for(session, verification.id)
        blockers = list(verdict.blocker_codes) if verdict else None
    return _out(verification, blockers)


def queued_out(row: dict[str, Any]) -> VerificationOut:
    """A verification just queued, from the row `insert_plain_by_token` wrote: it has no verdict, so there is nothing
    to read for its answer, and no ORM object to make (that cost as much as rendering it)."""
    return _out(Listed._make(row.get(column) for column in Listed._fields), None)


def listed_out(row: Listed) -> VerificationOut:
    """A verification as the list read it on the driver: the list shows no blockers (a page reads no verdict)."""
    return _out(row, None)


def _out(verification: Verification | Listed, blockers: list[str] | None) -> VerificationOut:
    base = f"/v1/verifications/{verification.id}"
    return VerificationOut(
        id=verification.id, state=verification.state, attempt=verification.attempt,
        failed_attempts=verification.failed_attempts or 0, max_attempts=verification.max_attempts,
        submitted_by=verification.submitted_by,
        source_uri=verification.source_uri, artifact_uri=verification.artifact_uri,
        artifact_sha256=verification.artifact_sha256, policy_sha256=verification.policy_sha256,
        policy_origin=verification.policy_origin or "unrecorded",
        policy_version=_shown(_version(verification.policy)),
        created_at=as_utc(verification.created_at), started_at=as_utc(verification.started_at),
        finished_at=as_utc(verification.finished_at), progress=verification.progress,
        reason=verification.reason, reason_code=verification.reason_code,
        cluster_status=verification.cluster_status,
        queue_position=verification.queue_position, verdict=verification.verdict_result, blockers=blockers,
        reused_from=verification.reused_from,
        links={"self": base, "report": f"{base}/report", "events": f"{base}/events", "cancel": f"{base}/cancel",
               "callbacks": f"{base}/callbacks"},
    )
