"""Request dependencies: settings, a session whose commit/rollback the request owns, the caller."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import Depends, HTTPException, Request, status
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from service.auth import Role, digest
from service.config import Settings
from service.persistence import tokens
from service.persistence.db import read_first


async def get_settings(request: Request) -> Settings:
    """Async, like every dependency here that does no I/O: a sync one costs a trip to a pool thread."""
    return request.app.state.settings


async def _off_the_loop(step: Callable[[], object]) -> None:
    """A commit or rollback, in a pool thread of its own (like FastAPI's own teardown: a fresh limiter,
    so it never waits behind requests that wait for this connection), never cancelled half-way."""
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(step, limiter=anyio.CapacityLimiter(1))


async def get_session(request: Request) -> AsyncIterator[Session]:
    """The request owns its unit of work: commit when the endpoint returns, roll back if it raises.
    Opening a session does no I/O, so it happens on the event loop; the teardown goes to a thread only
    when a transaction is still open (an endpoint that committed itself costs none)."""
    session = request.app.state.session_factory()
    try:
        yield session
        if session.in_transaction():
            await _off_the_loop(session.commit)
    except BaseException:
        if session.in_transaction():
            await _off_the_loop(session.rollback)
        raise
    finally:
        session.close()  # committed or rolled back above: nothing left to send from the loop


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
SessionDep = Annotated[Session, Depends(get_session)]
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
    found = read_first(session, lambda reader: tokens.active_name_and_role(reader, token_sha256))
    return None if found is None else Principal(found[0], Role(found[1]))


def _or_401(principal: Principal | None) -> Principal:
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    return principal


def get_principal(request: Request, session: SessionDep) -> Principal:
    """The API authenticates by the Authorization header only: a cookie rides along with any request a
    browser makes, so it must never authorise a write or a JSON read."""
    return _or_401(principal_for(session, bearer(request)))


def ui_token_sha256(request: Request) -> str | None:
    """The pages' own GET reads: the header's token, or the one the cookie POST /ui/login set vouches for."""
    if secret := bearer(request):
        return digest(secret)
    cookie = request.cookies.get(UI_COOKIE) if request.method == "GET" else None
    return request.app.state.ui_sessions.token_sha256(cookie) if cookie else None


def get_ui_principal(request: Request, session: SessionDep) -> Principal:
    return _or_401(principal_by_digest(session, ui_token_sha256(request)))


async def get_principal_on_loop(request: Request, session: AsyncSessionDep) -> Principal:
    """`get_principal` for an endpoint on the async session: the same lookup, with no pool thread."""
    secret = bearer(request)
    return _or_401(await session.run_sync(principal_for, secret))


PrincipalDep = Annotated[Principal, Depends(get_principal)]
UiPrincipalDep = Annotated[Principal, Depends(get_ui_principal)]


def _check(principal: Principal, roles: frozenset[Role]) -> Principal:
    if principal.role not in roles:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {principal.role} may not do this")
    return principal


def require(roles: frozenset[Role]):
    """A dependency that admits only `roles` (bearer header)."""
    async def check(principal: PrincipalDep) -> Principal:
        return _check(principal, roles)
    return Depends(check)


def require_on_loop(roles: frozenset[Role]):
    """`require`, for an endpoint on the async session (it shares the endpoint's session and transaction)."""
    async def check(principal: Annotated[Principal, Depends(get_principal_on_loop)]) -> Principal:
        return _check(principal, roles)
    return Depends(check)


def require_ui(roles: frozenset[Role]):
    """A dependency for the UI's GET pages that admits only `roles` (header or UI cookie)."""
    async def check(principal: UiPrincipalDep) -> Principal:
        return _check(principal, roles)
    return Depends(check)
