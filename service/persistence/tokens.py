"""API tokens: stored only as sha256 digests of their secrets (service/auth.py makes the secrets)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session

from service.persistence import driver
from service.persistence.clock import now
from service.persistence.models import ApiToken

if TYPE_CHECKING:
    import psycopg


def add_token(session: Session, name: str, role: str, token_sha256: str) -> ApiToken:
    token = ApiToken(name=name, role=role, token_sha256=token_sha256, created_at=now(session))
    session.add(token)
    session.flush()
    return token


def active_token(session: Session, token_sha256: str) -> ApiToken | None:
    return session.scalar(select(ApiToken).where(ApiToken.token_sha256 == token_sha256,
                                                 ApiToken.revoked_at.is_(None)))


def active_name_and_role(session: Session, token_sha256: str) -> tuple[str, str] | None:
    """What every request asks of its token: two columns, no ORM object to build (see active_token), run on
    the session's connection (the ORM's path for Core SQL cost, with the insert's, 4% of a submission's CPU)."""
    row = session.connection().execute(NAME_AND_ROLE, {"token_sha256": token_sha256}).first()
    return None if row is None else (row.name, row.role)


# An active token's name and role, by its digest (bound as "token_sha256"): what every request asks of its token,
# and the caller a submission's insert on the driver names itself (`submission_insert`). Built once.
NAME_AND_ROLE = select(ApiToken.name, ApiToken.role).where(ApiToken.token_sha256 == bindparam("token_sha256"),
                                                           ApiToken.revoked_at.is_(None))


async def active_name_and_role_on_driver(connection: psycopg.AsyncConnection[Any],
                                         token_sha256: str) -> tuple[str, str] | None:
    """`active_name_and_role` on a connection `driver.borrowed` lent (Postgres): the same statement."""
    row = await driver.first_row(connection, driver.compiled(NAME_AND_ROLE), {"token_sha256": token_sha256})
    return None if row is None else (row[0], row[1])


def revoke_token(session: Session, name: str) -> bool:
    result = session.execute(update(ApiToken).where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
                             .values(revoked_at=now(session)))
    return cast(CursorResult, result).rowcount == 1


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))
