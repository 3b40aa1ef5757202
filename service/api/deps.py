"""Request dependencies: settings, a session whose commit/rollback the request owns, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from sqlalchemy.orm import Session

from service.auth import Role, digest
from service.config import Settings
from service.persistence import repository
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


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.cookies.get("convgate_token")


def get_principal(request: Request, session: SessionDep) -> Principal:
    secret = _bearer(request)
    token = repository.active_token(session, digest(secret)) if secret else None
    if token is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    return Principal(token.name, Role(token.role))


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require(roles: frozenset[Role]):
    """A dependency that admits only `roles`."""
    def check(principal: PrincipalDep) -> Principal:
        if principal.role not in roles:
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {principal.role} may not do this")
        return principal
    return Depends(check)
