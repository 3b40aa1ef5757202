"""The operator page: the queue, server-rendered, refreshed in place every two seconds.

Browsers cannot send bearer headers on navigation, so `/ui/queue?token=...` sets an HttpOnly
cookie once and redirects to the bare URL (the secret leaves the address bar and history).
"""

from __future__ import annotations

import html
import time
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from service.api.deps import Principal, SessionDep, SettingsDep, get_principal, require
from service.api.endpoints import queue_snapshot
from service.auth import OPERATE
from service.schemas import QueueOut

router = APIRouter(prefix="/ui")

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>convgate queue</title>
<style>
 body {{ font: 15px/1.4 system-ui, sans-serif; margin: 2rem; color: #1d2330; }}
 h1 {{ font-size: 1.4rem; }} .counts span {{ display: inline-block; margin-right: 1.2rem; padding: .3rem .6rem;
   border-radius: .4rem; background: #eef1f6; }} table {{ border-collapse: collapse; margin-top: 1rem; }}
 td, th {{ padding: .35rem .8rem; border-bottom: 1px solid #dde2ea; text-align: left; }}
 .running {{ color: #0b6e2e; font-weight: 600; }} .queued {{ color: #8a5a00; }}
 progress {{ width: 12rem; }}
</style></head>
<body data-rendered="{rendered}"><h1>convgate — verification queue</h1>
<div id="queue">{table}</div>
<script>
setInterval(async () => {{
  const response = await fetch("/ui/queue/table", {{credentials: "same-origin"}});
  if (response.ok) document.getElementById("queue").innerHTML = await response.text();
}}, 2000);
</script></body></html>"""


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


@router.get("/queue", response_class=HTMLResponse, response_model=None)
def queue_page(request: Request, session: SessionDep, settings: SettingsDep, token: str | None = None):
    if token is not None:
        redirect = RedirectResponse("/ui/queue", status_code=303)
        redirect.set_cookie("convgate_token", token, httponly=True, samesite="strict")
        return redirect
    return _authorised_page(request, session, settings)


def _authorised_page(request: Request, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    principal = get_principal(request, session)
    if principal.role not in OPERATE:
        return HTMLResponse("forbidden", status_code=403)
    table = render_table(queue_snapshot(session, settings.dispatcher))
    return HTMLResponse(PAGE.format(table=table, rendered=time.time_ns()))


@router.get("/queue/table", response_class=HTMLResponse)
def queue_table(session: SessionDep, settings: SettingsDep,
                principal: Annotated[Principal, require(OPERATE)]) -> HTMLResponse:
    return HTMLResponse(render_table(queue_snapshot(session, settings.dispatcher)))
