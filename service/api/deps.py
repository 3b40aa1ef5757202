"""Request dependencies and the caller: settings, the async session of the endpoints on the event loop,
who a bearer token or the pages' cookie names. Nothing here holds a sync session: a request's sync database
work is one unit in one pool thread (`service.api.units`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

import anyio
from fastapi import Depends, HTTPException, Request, status
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from service.auth import Role, digest
from service.config import Settings
from service.persistence import driver, tokens
from service.persistence.db import read_first


async def get_settings(request: Request) -> Settings:
    """Async, like every dependency here that does no I/O: a sync one costs a trip to a pool thread."""
    return request.app.state.settings


async def get_async_session(request: Request) -> AsyncIterator[AsyncSession]:
    """The unit of work of an endpoint that runs its ORM code on the event loop (`AsyncSession.run_sync`):
    the endpoint commits; anything it left open is rolled back here. Never cancelled half-way."""
    async with request.app.state.async_session_factory() as session:
        try:
            yield session
        finally:
            with anyio.CancelScope(shield=True):
                await session.close()  # rolls back whatever was not committed


SettingsDep = Annotated[Settings, Depends(get_settings)]
AsyncSessionDep = Annotated[AsyncSession, Depends(get_async_session)]


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role


UI_COOKIE = "convgate_token"  # set only by POST /ui/login (service/api/ui_sessions.py); Secure, HttpOnly, ...


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return None


def principal_for(session: Session, secret: str | None) -> Principal | None:
    return principal_by_digest(session, digest(secret) if secret else None)


def principal_by_digest(session: Session, token_sha256: str | None) -> Principal | None:
    if not token_sha256:
        return None
    return _principal(read_first(session, lambda reader: tokens.active_name_and_role(reader, token_sha256)))


async def principal_on_driver(engine: AsyncEngine, secret: str | None) -> Principal | None:
    """`principal_for` on Postgres's driver (`service.persistence.driver`): the same statement, no session."""
    if not secret:
        return None
    async with driver.borrowed(engine) as connection:
        return _principal(await tokens.active_name_and_role_on_driver(connection, digest(secret)))


def _principal(found: tuple[str, str] | None) -> Principal | None:
    """The principal an active token's (name, role) names."""
    return None if found is None else Principal(found[0], Role(found[1]))


def ui_token_sha256(request: Request) -> str | None:
    """The pages' own GET reads: the header's token, or the one the cookie POST /ui/login set vouches for."""
    if secret := bearer(request):
        return digest(secret)
    cookie = request.cookies.get(UI_COOKIE) if request.method == "GET" else None
    return request.app.state.ui_sessions.token_sha256(cookie) if cookie else None


def admitted(principal: Principal | None, roles: frozenset[Role]) -> Principal:
    """The caller when its role is one of `roles`: 401 without a valid token, 403 for another role."""
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    if principal.role not in roles:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {principal.role} may not do this")
    return principal


async def get_principal_on_loop(request: Request, session: AsyncSessionDep) -> Principal | None:
    """The bearer token's principal for an endpoint on the async session, with no pool thread."""
    return await session.run_sync(principal_for, bearer(request))


def require_on_loop(roles: frozenset[Role]):
    """A dependency that admits only `roles` (bearer header), for an endpoint on the async session (it
    shares the endpoint's session and transaction): a bad token is a 401 before the body is looked at."""
    async def check(principal: Annotated[Principal | None, Depends(get_principal_on_loop)]) -> Principal:
        return admitted(principal, roles)
    return Depends(check)


async def get_caller(request: Request) -> Principal | None:
    """The bearer token's principal, looked up on the loop in an async session of its own that is closed at
    once: the request then does its work in one pool thread (`service.api.units`) holding no connection
    while it waits for it. On the loop, so a bad token is a 401 before any parameter is looked at."""
    async with request.app.state.async_session_factory() as session:
        return await session.run_sync(principal_for, bearer(request))


def caller(roles: frozenset[Role]):
    """A dependency that admits only `roles` (bearer header) of a route whose work is one unit in a pool
    thread. The API authenticates by the Authorization header only: a cookie rides along with any request a
    browser makes, so it never authorises a write or a JSON read."""
    async def check(principal: Annotated[Principal | None, Depends(get_caller)]) -> Principal:
        return admitted(principal, roles)
    return Depends(check)
