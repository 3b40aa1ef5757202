"""The operator page: the queue, server-rendered, refreshed in place every two seconds.

Browsers cannot send bearer headers on navigation, so the operator signs in once with a form:
`POST /ui/login` takes the token from the body (never from a URL, which lands in history, proxy
logs and Referer headers) and sets a cookie that is `Secure`, `HttpOnly`, `SameSite=Strict` and
scoped to `/ui`. The cookie is accepted only by this page's own GET reads; the JSON API and every
write take the Authorization header alone.
"""

from __future__ import annotations

import html
import time
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from service.api.deps import UI_COOKIE, Principal, SessionDep, SettingsDep, principal_for, require_ui, ui_secret
from service.api.endpoints import queue_snapshot
from service.auth import OPERATE
from service.schemas import QueueOut

router = APIRouter(prefix="/ui")
SESSION_SECONDS = 8 * 3600
MAX_FORM_BYTES = 4096

STYLE = """
 body {{ font: 15px/1.4 system-ui, sans-serif; margin: 2rem; color: #1d2330; }}
 h1 {{ font-size: 1.4rem; }} .counts span {{ display: inline-block; margin-right: 1.2rem; padding: .3rem .6rem;
   border-radius: .4rem; background: #eef1f6; }} table {{ border-collapse: collapse; margin-top: 1rem; }}
 td, th {{ padding: .35rem .8rem; border-bottom: 1px solid #dde2ea; text-align: left; }}
 .running {{ color: #0b6e2e; font-weight: 600; }} .queued {{ color: #8a5a00; }}
 progress {{ width: 12rem; }} .error {{ color: #a4161a; }}
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>convgate queue</title>
<style>""" + STYLE + """</style></head>
<body data-rendered="{rendered}"><h1>convgate — verification queue</h1>
<div id="queue">{table}</div>
<script>
setInterval(async () => {{
  const response = await fetch("/ui/queue/table", {{credentials: "same-origin"}});
  if (response.ok) document.getElementById("queue").innerHTML = await response.text();
}}, 2000);
</script></body></html>"""

LOGIN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>convgate sign in</title>
<style>""" + STYLE + """</style></head>
<body><h1>convgate — sign in</h1><p class="error">{message}</p>
<form method="post" action="/ui/login">
<label>Operator token <input type="password" name="token" autocomplete="current-password" required></label>
<button type="submit">Sign in</button>
</form></body></html>"""


def render_table(queue: QueueOut) -> str:
    counts = "".join(f"<span>{html.escape(state)}: <b>{n}</b></span>" for state, n in sorted(queue.counts.items()))
    oldest = (f"oldest waiting: {queue.oldest_waiting.id[:8]} for {queue.oldest_waiting.age_seconds:.0f}s"
              if queue.oldest_waiting else "nothing waiting")
    rows = []
    for item in queue.active:
        progress = item.progress or {}
        done, total = progress.get("done", 0), progress.get("total", 0) or 1
        bar = f"<progress value='{done}' max='{total}'></progress> {html.escape(str(progress.get('stage', '')))}"
        position = "" if item.queue_position is None else f"#{item.queue_position}"
        rows.append(f"<tr><td>{item.id[:8]}</td><td class='{item.state}'>{item.state}</td><td>{item.attempt}</td>"
                    f"<td>{item.age_seconds:.0f}s</td><td>{bar if progress else ''}</td>"
                    f"<td>{html.escape(item.cluster_status or '')} {position}</td>"
                    f"<td>{html.escape(item.worker or '')}</td><td>{item.failed_attempts}</td>"
                    f"<td>{html.escape(item.reason or '')}</td></tr>")
    table = ("<table><tr><th>id</th><th>state</th><th>attempt</th><th>age</th><th>progress</th>"
             "<th>cluster (Kueue)</th><th>worker</th><th>failed</th><th>last reason</th></tr>"
             + "".join(rows) + "</table>")
    return (f"<div class='snapshot' data-rendered='{time.time_ns()}'><div class='counts'>{counts}</div>"
            f"<p>{html.escape(oldest)} · dispatcher {html.escape(queue.dispatcher)}</p>{table}</div>")


def login_page(message: str = "", status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(LOGIN.format(message=html.escape(message)), status_code=status_code)


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
                 "schema": {"type": "object", "properties": {"token": {"type": "string", "maxLength": 512}},
                            "required": ["token"]}}}}},
             responses={303: {"description": "signed in: the cookie is set, on to /ui/queue"},
                        400: {"description": "a malformed form"},
                        401: {"description": "not a valid token"}, 403: {"description": "not an operator"}})
async def login(request: Request, session: SessionDep) -> Response:
    """Sign in with a token in the form body; sets the UI cookie for operators and admins."""
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
    principal = principal_for(session, secret)
    if principal is None:
        return login_page("not a valid token", 401)
    if principal.role not in OPERATE:
        return login_page(f"role {principal.role} may not see the queue", 403)
    redirect = RedirectResponse("/ui/queue", status_code=303)
    redirect.set_cookie(UI_COOKIE, secret, max_age=SESSION_SECONDS, path="/ui", secure=True, httponly=True,
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
    principal = principal_for(session, ui_secret(request))
    if principal is None:
        return login_page("sign in to see the queue", 401)
    if principal.role not in OPERATE:
        return HTMLResponse("forbidden", status_code=403)
    table = render_table(queue_snapshot(session, settings.dispatcher))
    return HTMLResponse(PAGE.format(table=table, rendered=time.time_ns()))


@router.get("/queue/table", response_class=HTMLResponse)
def queue_table(session: SessionDep, settings: SettingsDep,
                principal: Annotated[Principal, require_ui(OPERATE)]) -> HTMLResponse:
    return HTMLResponse(render_table(queue_snapshot(session, settings.dispatcher)))
