"""Request dependencies: settings, a session whose commit/rollback the request owns, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from sqlalchemy.orm import Session

from service.auth import Role, digest
from service.config import Settings
from service.persistence import tokens
from service.persistence.db import transaction


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    """The request owns its unit of work: commit when the endpoint returns, roll back if it raises."""
    with transaction(request.app.state.session_factory) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role


UI_COOKIE = "convgate_token"  # set only by POST /ui/login; Secure, HttpOnly, SameSite=Strict, Path=/ui


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


def principal_for(session: Session, secret: str | None) -> Principal | None:
    token = tokens.active_token(session, digest(secret)) if secret else None
    return None if token is None else Principal(token.name, Role(token.role))


def _principal_or_401(session: Session, secret: str | None) -> Principal:
    principal = principal_for(session, secret)
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    return principal


def get_principal(request: Request, session: SessionDep) -> Principal:
    """The API authenticates by the Authorization header only: a cookie rides along with any request a
    browser makes, so it must never authorise a write or a JSON read."""
    return _principal_or_401(session, _bearer(request))


def ui_secret(request: Request) -> str | None:
    """The operator page's own GET reads: the header, or the cookie POST /ui/login set."""
    if request.method != "GET":
        return _bearer(request)
    return _bearer(request) or request.cookies.get(UI_COOKIE)


def get_ui_principal(request: Request, session: SessionDep) -> Principal:
    return _principal_or_401(session, ui_secret(request))


PrincipalDep = Annotated[Principal, Depends(get_principal)]
UiPrincipalDep = Annotated[Principal, Depends(get_ui_principal)]


def _check(principal: Principal, roles: frozenset[Role]) -> Principal:
    if principal.role not in roles:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {principal.role} may not do this")
    return principal


def require(roles: frozenset[Role]):
    """A dependency that admits only `roles` (bearer header)."""
    def check(principal: PrincipalDep) -> Principal:
        return _check(principal, roles)
    return Depends(check)


def require_ui(roles: frozenset[Role]):
    """A dependency for the UI's GET pages that admits only `roles` (header or UI cookie)."""
    def check(principal: UiPrincipalDep) -> Principal:
        return _check(principal, roles)
    return Depends(check)
