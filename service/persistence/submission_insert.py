"""The write of a new submission: its verification row and its "submitted" event, or nothing when the
submitter's idempotency key is taken. The hottest write the API makes, so it is Core SQL on the tables,
executed with parameters: on Postgres ONE statement (the event is inserted from the verification
insert's RETURNING, in a CTE), which halved a submission's database CPU and wall time against an ORM
insert plus a second INSERT (scripts/bench_api.py); SQLite cannot put an INSERT in a WITH, so two. The API
runs the Postgres statement on the driver with the caller's token looked up in it (`insert_as_caller_on_driver`,
`service.persistence.driver`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sqlalchemy import Integer, Select, String, Table, bindparam, insert, literal, null, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from service.lifecycle import Reason, State
from service.persistence import driver, tokens
from service.persistence.models import Verification, VerificationEvent

if TYPE_CHECKING:
    import psycopg

_VERIFICATIONS = cast(Table, Verification.__table__)
_EVENTS = cast(Table, VerificationEvent.__table__)
_EVENT_COLUMNS = ("verification_id", "at", "from_state", "to_state", "attempt", "message", "reason_code")


def insert_queued(session: Session, row: dict[str, Any]) -> bool:
    """Insert the queued verification `row` and its event; False (nothing written) when the unique
    index on (submitted_by, idempotency_key) already holds the key: ON CONFLICT DO NOTHING waits for a
    concurrent duplicate to commit or roll back instead of failing, so no savepoint and no SELECT first."""
    connection = session.connection()  # Core on the session's connection: no ORM execution for Core SQL
    if connection.dialect.name == "postgresql":
        return connection.scalar(_with_event(tuple(sorted(row))), row) is not None
    if connection.scalar(_SQLITE_UNLESS_KNOWN, row) is None:
        return False
    connection.execute(_SQLITE_EVENT, {"verification_id": row["id"], "at": row["created_at"],  # from no state
                                    "to_state": State.QUEUED, "attempt": 0, "message": "submitted",
                                    "reason_code": Reason.SUBMITTED})
    return True


class Caller(NamedTuple):
    """What `insert_as_caller_on_driver` found: the token's name and role, and whether the row was written."""

    name: str
    role: str
    inserted: bool


async def insert_as_caller_on_driver(connection: psycopg.AsyncConnection[Any], row: dict[str, Any],
                                     token_sha256: str, roles: frozenset[str]) -> Caller | None:
    """`insert_queued` on Postgres, on a connection `driver.borrowed` lent, by the active token `token_sha256`:
    the token is looked up by the statement that writes the row, which names its holder as the submitter
    (`row`'s own `submitted_by` is not written), and only when its role is one of `roles`. None when no active
    token has that digest; else its name, its role and whether the row was written (not when the role may not
    submit, or the key was used). Committed when it returns (the connection is in autocommit)."""
    statement = driver.compiled(_with_event(tuple(sorted(set(row) - {"submitted_by"})), tuple(sorted(roles))))
    found = await driver.first_row(connection, statement, row | {"token_sha256": token_sha256})
    return None if found is None else Caller(found[0], found[1], found[2] is not None)


@functools.cache  # one statement per set of columns written (optional ones are left out when unset) and roles
def _with_event(columns: tuple[str, ...], roles: tuple[str, ...] | None = None) -> Insert | Select[Any]:
    """The verification and its event, in one statement. With `roles`, written by the caller: the active
    token bound as "token_sha256" names the submitter, and is returned with whether it wrote (only when its
    role is one of `roles`); the row's other columns are `columns`."""
    values = [bindparam(name, type_=_VERIFICATIONS.c[name].type) for name in columns]
    if roles is None:
        verification = postgresql.insert(_VERIFICATIONS).values(dict(zip(columns, values, strict=True)))
    else:
        caller = tokens.NAME_AND_ROLE.cte("caller")
        by_caller = select(caller.c.name, *values).where(caller.c.role.in_([literal(role, String()) for role in roles]))
        verification = postgresql.insert(_VERIFICATIONS).from_select(("submitted_by", *columns), by_caller,
                                                                      include_defaults=False)
    new = verification.on_conflict_do_nothing().returning(_VERIFICATIONS.c.id).cte("new")
    event = select(new.c.id, bindparam("created_at", type_=_EVENTS.c.at.type), null(),
                   literal(State.QUEUED.value, String()), literal(0, Integer()), literal("submitted", String()),
                   literal(Reason.SUBMITTED.value, String()))
    written = insert(_EVENTS).from_select(_EVENT_COLUMNS, event).returning(_EVENTS.c.verification_id)
    if roles is None:
        return written
    return select(caller.c.name, caller.c.role, select(written.cte("written").c.verification_id).scalar_subquery())


_SQLITE_UNLESS_KNOWN = sqlite.insert(_VERIFICATIONS).on_conflict_do_nothing().returning(_VERIFICATIONS.c.id)
_SQLITE_EVENT = insert(_EVENTS)
