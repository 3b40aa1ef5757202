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
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.engine import Row
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.api.deps import UI_COOKIE, Principal, SessionDep, SettingsDep, principal_for, require_ui
from service.api.endpoints import queue_snapshot
from service.api.pages_html import (
    PAGES,
    document,
    duration,
    esc,
    login_page,
    model_cell,
    page_principal,
    safe_next,
)
from service.api.ui_sessions import SESSION_SECONDS
from service.attestations import KeyFileError
from service.auth import OPERATE
from service.persistence.recent import recent_finished
from service.persistence.repository import as_utc
from service.schemas import QueueItem, QueueOut

router = APIRouter(prefix="/ui")
MAX_FORM_BYTES = 4096
RECENT = 20  # finished verifications shown under the queue
ACTIVE_HEAD = ("id", "model", "submitter", "state", "attempt", "waited", "ran", "progress", "Kueue", "worker",
               "failed", "last reason")
FINISHED_HEAD = ("id", "model", "submitter", "finished", "outcome", "first blocker", "reason", "waited", "ran",
                 "report")
REFRESH = """<script>
setInterval(async () => {
  const response = await fetch("/ui/queue/table", {credentials: "same-origin"});
  if (response.ok) document.getElementById("queue").innerHTML = await response.text();
}, 2000);
</script>"""


def _kueue(status: str | None, position: int | None) -> str:
    """The status and, while Kueue reports one, the position: `pending admission #3`."""
    return " ".join(part for part in (status, None if position is None else f"#{position}") if part)


def _active_row(item: QueueItem) -> str:
    progress = item.progress or {}
    done, total = progress.get("done", 0), progress.get("total", 0) or 1
    bar = f"<progress value='{esc(done)}' max='{esc(total)}'></progress> {esc(progress.get('stage', ''))}"
    state = esc(item.state)
    return (f"<tr><td title='{esc(item.id)}'>{esc(item.id[:8])}</td>{model_cell(item.artifact_uri, item.source_uri)}"
            f"<td>{esc(item.submitted_by)}</td><td class='{state}'>{state}</td><td>{item.attempt}</td>"
            f"<td>{duration(item.wait_seconds)}</td><td>{duration(item.run_seconds)}</td>"
            f"<td>{bar if progress else ''}</td><td>{esc(_kueue(item.cluster_status, item.queue_position))}</td>"
            f"<td>{esc(item.worker)}</td><td>{item.failed_attempts}</td><td>{esc(item.reason)}</td></tr>")


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (as_utc(end) - as_utc(start)).total_seconds()


def _finished_row(row: Row[Any], moment: datetime) -> str:
    """A verdict links to its report; a run without one shows why it ended instead."""
    outcome = esc(row.verdict_result or row.state)
    link = esc(f"/ui/verifications/{row.id}/report")
    ident = f"<a href='{link}'>{esc(row.id[:8])}</a>" if row.verdict_result else esc(row.id[:8])
    report = f"<a class='report' href='{link}'>report</a>" if row.verdict_result else ""
    ago = _seconds(row.finished_at, moment)
    return (f"<tr><td title='{esc(row.id)}'>{ident}</td>{model_cell(row.artifact_uri, row.source_uri)}"
            f"<td>{esc(row.submitted_by)}</td><td>{duration(ago)}{'' if ago is None else ' ago'}</td>"
            f"<td class='{outcome}'>{outcome}</td><td><code>{esc(row.first_blocker)}</code></td>"
            f"<td>{'' if row.verdict_result else esc(row.reason)}</td>"
            f"<td>{duration(_seconds(row.created_at, row.started_at))}</td>"
            f"<td>{duration(_seconds(row.started_at, row.finished_at))}</td><td>{report}</td></tr>")


def _table(ident: str, head: tuple[str, ...], rows: list[str]) -> str:
    return (f"<table id='{ident}'><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def render_table(queue: QueueOut, finished: list[Row[Any]] | None = None) -> str:
    """The snapshot the page refreshes in place: counts, active work, then the latest finished."""
    counts = "".join(f"<span>{esc(state)}: <b>{n}</b></span>" for state, n in sorted(queue.counts.items()))
    oldest = (f"oldest waiting: {queue.oldest_waiting.id[:8]} for {queue.oldest_waiting.age_seconds:.0f}s"
              if queue.oldest_waiting else "nothing waiting")
    moment = datetime.now(UTC)
    return (f"<div class='snapshot' data-rendered='{time.time_ns()}'><div class='counts'>{counts}</div>"
            f"<p>{esc(oldest)} · dispatcher {esc(queue.dispatcher)}</p>"
            + _table("active", ACTIVE_HEAD, [_active_row(item) for item in queue.active])
            + "<h2>Recently finished</h2>"
            + _table("finished", FINISHED_HEAD, [_finished_row(row, moment) for row in finished or []]) + "</div>")


def _snapshot(session: Session, dispatcher: str) -> str:
    return render_table(queue_snapshot(session, dispatcher), recent_finished(session, RECENT))


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
async def login(request: Request, session: SessionDep) -> Response:
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
    # the lookup waits on the database (on SQLite, for its write lock): never on the event loop
    principal = await run_in_threadpool(principal_for, session, secret)
    if principal is None:
        return login_page("not a valid token", 401, target)
    if principal.role not in roles:
        return login_page(f"role {principal.role} may not {what}", 403, target)
    try:
        cookie = await run_in_threadpool(request.app.state.ui_sessions.issue, secret)  # first use reads the key
    except KeyFileError as exc:
        return login_page(f"sign-in unavailable: the signing key cannot be loaded ({exc})", 503, target)
    redirect = RedirectResponse(target, status_code=303)
    redirect.set_cookie(UI_COOKIE, cookie, max_age=SESSION_SECONDS, path="/ui", secure=True, httponly=True,
                        samesite="strict")
    return redirect


@router.post("/logout", response_model=None, responses={303: {"description": "signed out: on to /ui/login"}})
def logout() -> Response:
    redirect = RedirectResponse("/ui/login", status_code=303)
    redirect.delete_cookie(UI_COOKIE, path="/ui", secure=True, httponly=True, samesite="strict")
    return redirect


@router.get("/queue", response_class=HTMLResponse, response_model=None,
            responses={401: {"description": "not signed in: the sign-in form"}})
def queue_page(request: Request, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    principal = page_principal(request, session, "/ui/queue")
    if isinstance(principal, HTMLResponse):
        return principal
    body = f"<h1>convgate — verification queue</h1><div id='queue'>{_snapshot(session, settings.dispatcher)}</div>"
    return HTMLResponse(document("convgate queue", body, rendered=time.time_ns(), script=REFRESH))


@router.get("/queue/table", response_class=HTMLResponse)
def queue_table(session: SessionDep, settings: SettingsDep,
                principal: Annotated[Principal, require_ui(OPERATE)]) -> HTMLResponse:
    return HTMLResponse(_snapshot(session, settings.dispatcher))
