"""Request dependencies and the caller: settings, who a bearer token or the pages' cookie names. A lookup here
ends before the request's work begins: that work is one unit in one pool thread (`service.api.units`), or
the route's own on the event loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from service.auth import Role, digest
from service.config import Settings
from service.persistence import driver, tokens
from service.persistence.db import read_first

if TYPE_CHECKING:
    import psycopg


async def get_settings(request: Request) -> Settings:
    """Async, like every dependency here that does no I/O: a sync one costs a trip to a pool thread."""
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


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
        return await principal_on(connection, secret)


async def principal_on(connection: psycopg.AsyncConnection[Any], secret: str | None) -> Principal | None:
    """`principal_on_driver` on a connection the route already borrowed for its work."""
    if not secret:
        return None
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


def unauthenticated() -> HTTPException:
    """The 401 of a request without a valid bearer token."""
    return HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid bearer token",
                         headers={"WWW-Authenticate": "Bearer"})


def admitted(principal: Principal | None, roles: frozenset[Role]) -> Principal:
    """The caller when its role is one of `roles`: 401 without a valid token, 403 for another role."""
    if principal is None:
        raise unauthenticated()
    if principal.role not in roles:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"role {principal.role} may not do this")
    return principal


async def get_caller(request: Request) -> Principal | None:
    """The bearer token's principal, looked up on the loop and ended before the work, which then holds no
    connection while it waits (a pool thread, `service.api.units`): on Postgres on the driver
    (`principal_on_driver`), on SQLite in an async session of its own, closed at once (a deferred read that
    takes no write lock). On the loop, so a bad token is a 401 before any parameter is looked at."""
    engine = request.app.state.async_engine
    if driver.available(engine):
        return await principal_on_driver(engine, bearer(request))
    async with request.app.state.async_session_factory() as session:
        return await session.run_sync(principal_for, bearer(request))


def caller(roles: frozenset[Role]):
    """A dependency that admits only `roles` (bearer header) of a route whose work is one unit in a pool
    thread. The API authenticates by the Authorization header only: a cookie rides along with any request a
    browser makes, so it never authorises a write or a JSON read."""
    async def check(principal: Annotated[Principal | None, Depends(get_caller)]) -> Principal:
        return admitted(principal, roles)
    return Depends(check)
