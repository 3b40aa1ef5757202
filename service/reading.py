"""What a caller may read of the verifications: one verification (a submitter sees only their own),
a page of them, a verdict's report, the events and the callback deliveries, as the API serves them.

Why a module between the endpoints and the repository: who may see what is decided here once, for
the JSON API, the auditor's pages and the exports alike, and the endpoints keep only HTTP (status
codes, media types, the access log). The repository stays the only place that speaks SQL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from edge.redact import redact_uri
from service.persistence import callbacks as callback_store
from service.persistence import listing, repository
from service.persistence.clock import as_utc
from service.persistence.listing import Listed, ListFilters
from service.persistence.models import Verdict, Verification
from service.schemas import CallbackDeliveryOut, CallbacksOut, EventOut

if TYPE_CHECKING:
    import psycopg

__all__ = ["ListFilters", "Listed", "callbacks_of", "events_of", "logged_page_on_driver", "page", "served_report",
           "verdict_of", "visible", "with_verdict"]


def visible(session: Session, verification_id: str, *, only_of: str | None) -> Verification | None:
    """The verification, unless there is none or the caller may read only its own (`only_of`, its
    name) and this one is another's: the two answers look the same, so an id reveals nothing."""
    verification = repository.get_verification(session, verification_id)
    if verification is None or (only_of is not None and verification.submitted_by != only_of):
        return None
    return verification


def with_verdict(session: Session, verification_id: str) -> Verification | None:
    """The verification when it has a verdict (the auditor's pages show nothing else)."""
    verification = repository.get_verification(session, verification_id)
    return verification if verification is not None and verification.verdict_result is not None else None


def page(session: Session, filters: ListFilters, *, limit: int,
         cursor: str | None) -> tuple[list[Verification], str | None]:
    """Newest first; the cursor of the next page, when there is one (InvalidCursorError for a cursor
    this service did not make)."""
    return listing.page(session, filters, limit=limit, cursor=cursor)


async def logged_page_on_driver(connection: psycopg.AsyncConnection[Any], filters: ListFilters, *, limit: int,
                                cursor: str | None, logged: dict[str, Any]) -> tuple[list[Listed], str | None]:
    """`page` on Postgres's driver, its access-log row (`logged`) written by the same statement."""
    return await listing.logged_page_on_driver(connection, filters, limit=limit, cursor=cursor, logged=logged)


def verdict_of(session: Session, verification: Verification) -> Verdict | None:
    return repository.verdict_for(session, verification.id)


def served_report(verification: Verification, report: dict[str, Any]) -> dict[str, Any]:
    """The stored report is immutable; what is served adds where its thresholds came from."""
    policy = report.get("policy")
    if not isinstance(policy, dict):
        return report
    return {**report, "policy": {**policy, "origin": verification.policy_origin}}


def events_of(session: Session, verification_id: str) -> list[EventOut]:
    return [EventOut(at=as_utc(e.at), from_state=e.from_state, to_state=e.to_state, attempt=e.attempt,
                     message=e.message) for e in repository.events(session, verification_id)]


def callbacks_of(session: Session, verification: Verification) -> CallbacksOut:
    """The completion callback, its URL redacted (a presigned URL's query is a secret), and every
    delivery attempt so far."""
    url = verification.callback_url
    return CallbacksOut(
        callback_url=None if url is None else redact_uri(url), state=verification.callback_state,
        deliveries=[CallbackDeliveryOut(attempt=d.attempt, delivery_id=d.delivery_id, at=as_utc(d.at),
                                        status_code=d.status_code, error=d.error,
                                        next_retry_at=as_utc(d.next_retry_at))
                    for d in callback_store.deliveries(session, verification.id)])
