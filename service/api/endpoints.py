"""HTTP endpoints: thin; logic lives in `service.verifications`, queries in the repository."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.responses import HTMLResponse, PlainTextResponse

from service import verifications
from service.api.deps import Principal, SessionDep, SettingsDep, require
from service.auth import CANCEL, OPERATE, READ_OWN_OR_ANY, SUBMIT, Role
from service.persistence import repository
from service.persistence.models import Verification
from service.report_render import to_html, to_markdown
from service.schemas import EventOut, QueueItem, QueueOut, SubmitRequest, VerificationList, VerificationOut

router = APIRouter(prefix="/v1")


def _visible(session: SessionDep, verification_id: str, principal: Principal) -> Verification:
    verification = repository.get_verification(session, verification_id)
    if verification is None or (principal.role == Role.SUBMITTER and verification.submitted_by != principal.name):
        raise HTTPException(status.HTTP_404_NOT_FOUND, "no such verification")
    return verification


@router.post("/verifications", status_code=status.HTTP_202_ACCEPTED, response_model=VerificationOut)
def create_verification(
    body: SubmitRequest, response: Response, session: SessionDep, settings: SettingsDep,
    principal: Annotated[Principal, require(SUBMIT)],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> VerificationOut:
    try:
        verification, created = verifications.submit(session, settings, principal.name, body, idempotency_key)
        # Commit here, in the request's own thread, not in the dependency's teardown: concurrent
        # duplicates wait on this row's unique-index lock, and a teardown queued behind them for a
        # threadpool slot would deadlock until the pool times out.
        session.commit()
    except verifications.SubmissionError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    except verifications.IdempotencyConflictError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
    response.headers["Location"] = f"/v1/verifications/{verification.id}"
    if not created:
        response.status_code = status.HTTP_200_OK
    return verifications.to_out(session, verification)


@router.get("/verifications/{verification_id}", response_model=VerificationOut)
def read_verification(verification_id: str, session: SessionDep,
                      principal: Annotated[Principal, require(READ_OWN_OR_ANY)]) -> VerificationOut:
    return verifications.to_out(session, _visible(session, verification_id, principal))


@router.get("/verifications", response_model=VerificationList)
def list_verifications(
    session: SessionDep, principal: Annotated[Principal, require(READ_OWN_OR_ANY)],
    artifact_sha256: Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$")] = None,
    source_uri: str | None = None,
    verdict: Literal["GO", "NO-GO"] | None = None,
    state: str | None = None,
    submitted_by: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
) -> VerificationList:
    if principal.role == Role.SUBMITTER:
        submitted_by = principal.name
    filters = repository.ListFilters(artifact_sha256, source_uri, verdict, state, submitted_by, since, until)
    try:
        rows, next_cursor = repository.list_verifications(session, filters, limit=limit, cursor=cursor)
    except ValueError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "invalid cursor") from exc
    items = [verifications.to_out(session, row, with_blockers=False) for row in rows]
    return VerificationList(items=items, next_cursor=next_cursor)


@router.get("/verifications/{verification_id}/report", response_model=None)
def read_report(verification_id: str, request: Request, session: SessionDep,
                principal: Annotated[Principal, require(READ_OWN_OR_ANY)]):
    verification = _visible(session, verification_id, principal)
    verdict = repository.verdict_for(session, verification.id)
    if verdict is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no verdict yet (state {verification.state})")
    accept = request.headers.get("accept", "application/json")
    if "text/markdown" in accept:
        return PlainTextResponse(to_markdown(verification.id, verdict.report), media_type="text/markdown")
    if "text/html" in accept:
        return HTMLResponse(to_html(verification.id, verdict.report))
    return verdict.report


@router.get("/verifications/{verification_id}/events", response_model=list[EventOut])
def read_events(verification_id: str, session: SessionDep,
                principal: Annotated[Principal, require(READ_OWN_OR_ANY)]) -> list[EventOut]:
    _visible(session, verification_id, principal)
    return [EventOut(at=repository.as_utc(e.at), from_state=e.from_state, to_state=e.to_state, attempt=e.attempt,
                     message=e.message) for e in repository.events(session, verification_id)]


@router.post("/verifications/{verification_id}/cancel", response_model=VerificationOut)
def cancel_verification(verification_id: str, session: SessionDep,
                        principal: Annotated[Principal, require(CANCEL)]) -> VerificationOut:
    verification = _visible(session, verification_id, principal)
    return verifications.to_out(session, verifications.cancel(session, verification, principal.name))


def queue_snapshot(session: SessionDep, dispatcher: str) -> QueueOut:
    moment = datetime.now(UTC)

    def item(v: Verification) -> QueueItem:
        age = (moment - repository.as_utc(v.created_at)).total_seconds()
        return QueueItem(id=v.id, state=v.state, attempt=v.attempt, failed_attempts=v.failed_attempts or 0,
                         age_seconds=age, progress=v.progress, worker=v.worker, reason=v.reason,
                         cluster_status=v.cluster_status, queue_position=v.queue_position)

    oldest = repository.oldest_queued(session)
    return QueueOut(counts=repository.state_counts(session), oldest_waiting=item(oldest) if oldest else None,
                    active=[item(v) for v in repository.active(session)], dispatcher=dispatcher)


@router.get("/queue", response_model=QueueOut)
def read_queue(session: SessionDep, settings: SettingsDep,
               principal: Annotated[Principal, require(OPERATE)]) -> QueueOut:
    return queue_snapshot(session, settings.dispatcher)
