"""What the server-rendered pages share: the look, escaping, the sign-in form and who may see a page.

Every value that came from a submitter, a worker or the cluster goes through `esc` (attribute-safe:
quotes too), so a source URI carrying markup is shown, never run. No framework and no build step:
plain HTML forms and links, and one small script on the operator page that refreshes its table.
"""

from __future__ import annotations

import html
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import Principal, principal_by_digest, ui_token_sha256
from service.auth import OPERATE, READ_ANY, Role

STYLE = """
 body { font: 15px/1.4 system-ui, sans-serif; margin: 2rem; color: #1d2330; }
 h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 2rem; }
 .counts span { display: inline-block; margin-right: 1.2rem; padding: .3rem .6rem;
   border-radius: .4rem; background: #eef1f6; } table { border-collapse: collapse; margin-top: 1rem; }
 td, th { padding: .35rem .8rem; border-bottom: 1px solid #dde2ea; text-align: left; vertical-align: top; }
 td small { display: block; color: #5b6475; max-width: 28rem; overflow-wrap: anywhere; }
 .running { color: #0b6e2e; font-weight: 600; } .queued { color: #8a5a00; }
 .GO { color: #0b6e2e; font-weight: 600; } .NO-GO, .failed { color: #a4161a; font-weight: 600; }
 progress { width: 12rem; } .error { color: #a4161a; } code { font-size: .9em; }
 form.search { display: flex; flex-wrap: wrap; gap: .6rem 1rem; align-items: end; }
 form.search label { display: flex; flex-direction: column; font-size: .85rem; color: #5b6475; }
"""

# A page, the roles that may see it and what a refused role is told it may not do. A sign-in names its
# page in `next`; nothing else is ever redirected to, so the form cannot send anyone off-site.
PAGES: dict[str, tuple[frozenset[Role], str]] = {
    "/ui/queue": (OPERATE, "see the queue"),
    "/ui/auditor": (READ_ANY, "search verdicts"),
}
DEFAULT_PAGE = "/ui/queue"

LOGIN = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>convgate sign in</title>
<style>{style}</style></head>
<body><h1>convgate — sign in</h1><p class="error">{message}</p>
<form method="post" action="/ui/login">
<input type="hidden" name="next" value="{next}">
<label>Token <input type="password" name="token" autocomplete="current-password" required></label>
<button type="submit">Sign in</button>
</form></body></html>"""


def esc(value: object) -> str:
    """Text for an element or a quoted attribute; None is empty."""
    return "" if value is None else html.escape(str(value), quote=True)


def document(title: str, body: str, *, rendered: int | None = None, script: str = "") -> str:
    stamp = "" if rendered is None else f' data-rendered="{rendered}"'
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style></head>\n<body{stamp}>{body}{script}</body></html>")


def artifact_name(uri: str | None) -> str:
    """The artifact's file name: the last segment of its URI's path (hf://org/repo@rev/x.gguf -> x.gguf)."""
    if not uri:
        return ""
    path = urlsplit(uri).path or uri
    return path.rstrip("/").rsplit("/", 1)[-1] or uri


def model_cell(artifact_uri: str | None, source_uri: str | None) -> str:
    """The artifact's name, its URI on hover, and the source it was converted from beneath."""
    return (f"<td><span title='{esc(artifact_uri)}'>{esc(artifact_name(artifact_uri))}</span> "
            f"<small>{esc(source_uri)}</small></td>")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole // 60 % 60:02d}m"


def safe_next(target: str | None) -> str:
    return target if target in PAGES else DEFAULT_PAGE


def login_page(message: str = "", status_code: int = 200, next_page: str = DEFAULT_PAGE) -> HTMLResponse:
    return HTMLResponse(LOGIN.format(style=STYLE, message=esc(message), next=esc(safe_next(next_page))),
                        status_code=status_code)


def page_principal(request: Request, session: Session, page: str) -> Principal | HTMLResponse:
    """The signed-in caller allowed on `page` (the UI cookie or a bearer header), else the page to show:
    the sign-in form (401), which returns to `page`, or a refusal (403)."""
    roles, what = PAGES[page]
    principal = principal_by_digest(session, ui_token_sha256(request))
    if principal is None:
        return login_page(f"sign in to {what}", 401, page)
    if principal.role not in roles:
        return HTMLResponse(f"forbidden: role {esc(principal.role)} may not {what}", status_code=403)
    return principal
