"""The operator page: the queue, server-rendered, refreshed in place every two seconds; and the pages'
sign-in. Each active verification shows its model (artifact name and source), submitter, wait and
run times and Kueue status and position; below, the latest finished ones with their outcome, first
blocker and failure reason, each verdict linking to its rendered report.

Browsers cannot send bearer headers on navigation, so a person signs in once with a form:
`POST /ui/login` takes the token from the body (never from a URL, which lands in history, proxy
logs and Referer headers) and sets a cookie that is `Secure`, `HttpOnly`, `SameSite=Strict` and
scoped to `/ui`. The cookie is accepted only by the pages' own GET reads; the JSON API and every
write take the Authorization header alone. The form's `next` names the page to return to (the queue
or the auditor page, nothing else), and the sign-in admits only the roles of that page.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session

from service.api.deps import UI_COOKIE, SettingsDep, admitted, principal_by_digest, principal_for, ui_token_sha256
from service.api.pages_html import PAGES, login_page, page_principal, safe_next
from service.api.ui_sessions import SESSION_SECONDS
from service.api.units import one_trip
from service.attestations import KeyFileError
from service.auth import OPERATE
from service.config import Settings
from service.persistence.clock import as_utc, now
from service.persistence.recent import recent_finished
from service.queue import snapshot as queue_snapshot
from service.templating import render

router = APIRouter(prefix="/ui")
MAX_FORM_BYTES = 4096
RECENT = 20  # finished verifications shown under the queue
ACTIVE_HEAD = ("id", "model", "submitter", "state", "attempt", "waited", "ran", "starts in", "progress", "Kueue",
               "worker", "failed", "last reason")
FINISHED_HEAD = ("id", "model", "submitter", "finished", "outcome", "first blocker", "reason", "waited", "ran",
                 "report")


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (as_utc(end) - as_utc(start)).total_seconds()


def _finished(row: Row[Any], moment: datetime) -> dict[str, Any]:
    """A finished row with its times as durations: how long ago, how long it waited and ran."""
    return {**row._asdict(), "ago": _seconds(row.finished_at, moment),
            "waited": _seconds(row.created_at, row.started_at), "ran": _seconds(row.started_at, row.finished_at)}


def _snapshot(session: Session, settings: Settings) -> dict[str, Any]:
    """What the queue's snapshot shows: counts, active work, then the latest finished."""
    queue = queue_snapshot(session, settings)
    moment = now(session)
    return {"rendered": time.time_ns(), "counts": sorted(queue.counts.items()), "oldest": queue.oldest_waiting,
            "dispatcher": queue.dispatcher, "active": queue.active, "active_head": ACTIVE_HEAD,
            "estimate": queue.estimate,
            "finished_head": FINISHED_HEAD,
            "finished": [_finished(row, moment) for row in recent_finished(session, RECENT)]}


def _cross_site(request: Request) -> bool:
    """A login posted from another site (login CSRF): its Origin names another host."""
    origin = request.headers.get("origin")
    if request.headers.get("sec-fetch-site") == "cross-site":
        return True
    return origin is not None and (origin == "null" or urlsplit(origin).netloc != request.headers.get("host"))


@router.get("/login", response_class=HTMLResponse)
def login_form() -> HTMLResponse:
    return login_page()


@router.post("/login", response_class=HTMLResponse, response_model=None,
             openapi_extra={"requestBody": {"required": True, "content": {"application/x-www-form-urlencoded": {
                 "schema": {"type": "object", "properties": {"token": {"type": "string", "maxLength": 512},
                                                             "next": {"type": "string", "enum": list(PAGES)}},
                            "required": ["token"]}}}}},
             responses={303: {"description": "signed in: the cookie is set, on to `next` (default /ui/queue)"},
                        400: {"description": "a malformed form"},
                        401: {"description": "not a valid token"}, 403: {"description": "a role not of that page"},
                        429: {"description": "too many sign-in attempts from this address or for this token "
                                              "prefix: retry after `Retry-After` seconds"},
                        503: {"description": "the database or the signing key is unavailable"}})
async def login(request: Request) -> Response:
    """Sign in with a token in the form body; sets the UI cookie for the roles of the page it returns to."""
    if _cross_site(request):
        return login_page("sign-in from another site refused", 403)
    raw = await request.body()
    try:
        if len(raw) > MAX_FORM_BYTES:
            raise ValueError("form too large")
        fields = parse_qs(raw.decode("utf-8", "replace"), max_num_fields=4)
    except ValueError:  # too large, or too many fields
        return login_page("malformed sign-in form", 400)
    secret = (fields.get("token") or [""])[0].strip()
    target = safe_next((fields.get("next") or [""])[0])
    roles, what = PAGES[target]
    wait = request.app.state.login_throttle.wait_seconds(request.client.host if request.client else "", secret)
    if wait:
        refused = login_page("too many sign-in attempts: wait and try again", 429, target)
        refused.headers["Retry-After"] = str(int(wait))
        return refused

    def sign_in(session: Session) -> Response:
        """The lookup waits on the database, and the cookie's first use reads the key: never on the loop."""
        principal = principal_for(session, secret)
        if principal is None:
            return login_page("not a valid token", 401, target)
        if principal.role not in roles:
            return login_page(f"role {principal.role} may not {what}", 403, target)
        try:
            cookie = request.app.state.ui_sessions.issue(secret)
        except KeyFileError as exc:
            return login_page(f"sign-in unavailable: the signing key cannot be loaded ({exc})", 503, target)
        redirect = RedirectResponse(target, status_code=303)
        redirect.set_cookie(UI_COOKIE, cookie, max_age=SESSION_SECONDS, path="/ui", secure=True, httponly=True,
                            samesite="strict")
        return redirect
    return await one_trip(request, sign_in)


@router.post("/logout", response_model=None, responses={303: {"description": "signed out: on to /ui/login"}})
def logout() -> Response:
    redirect = RedirectResponse("/ui/login", status_code=303)
    redirect.delete_cookie(UI_COOKIE, path="/ui", secure=True, httponly=True, samesite="strict")
    return redirect


@router.get("/queue", response_class=HTMLResponse, response_model=None,
            responses={401: {"description": "not signed in: the sign-in form"}})
async def queue_page(request: Request, settings: SettingsDep) -> HTMLResponse:
    def page(session: Session) -> HTMLResponse:
        principal = page_principal(request, session, "/ui/queue")
        if isinstance(principal, HTMLResponse):
            return principal
        return HTMLResponse(render("queue.html", title="convgate queue", **_snapshot(session, settings)))
    return await one_trip(request, page)


@router.get("/queue/table", response_class=HTMLResponse)
async def queue_table(request: Request, settings: SettingsDep) -> HTMLResponse:
    """The table the page refreshes in place: the header's token or the pages' cookie."""
    def table(session: Session) -> HTMLResponse:
        admitted(principal_by_digest(session, ui_token_sha256(request)), OPERATE)
        return HTMLResponse(render("queue_snapshot.html", **_snapshot(session, settings)))
    return await one_trip(request, table)
