"""What the server-rendered pages share: the sign-in form and who may see a page.

The pages are templates (service/templating.py, autoescaped), so a source URI carrying markup is shown,
never run. No framework and no build step: plain HTML forms and links, and one small script on the
operator page that refreshes its table.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service.api.deps import Principal, principal_by_digest, ui_token_sha256
from service.auth import OPERATE, READ_ANY, Role
from service.templating import render

# A page, the roles that may see it and what a refused role is told it may not do. A sign-in names its
# page in `next`; nothing else is ever redirected to, so the form cannot send anyone off-site.
PAGES: dict[str, tuple[frozenset[Role], str]] = {
    "/ui/queue": (OPERATE, "see the queue"),
    "/ui/auditor": (READ_ANY, "search verdicts"),
}
DEFAULT_PAGE = "/ui/queue"


def safe_next(target: str | None) -> str:
    return target if target in PAGES else DEFAULT_PAGE


def login_page(message: str = "", status_code: int = 200, next_page: str = DEFAULT_PAGE) -> HTMLResponse:
    return HTMLResponse(render("login.html", title="convgate sign in", message=message,
                               next_page=safe_next(next_page)), status_code=status_code)


def message_page(text: str, status_code: int) -> HTMLResponse:
    return HTMLResponse(render("message.html", title="convgate", message=text), status_code=status_code)


def page_principal(request: Request, session: Session, page: str) -> Principal | HTMLResponse:
    """The signed-in caller allowed on `page` (the UI cookie or a bearer header), else the page to show:
    the sign-in form (401), which returns to `page`, or a refusal (403)."""
    roles, what = PAGES[page]
    principal = principal_by_digest(session, ui_token_sha256(request))
    if principal is None:
        return login_page(f"sign in to {what}", 401, page)
    if principal.role not in roles:
        return message_page(f"forbidden: role {principal.role} may not {what}", 403)
    return principal
