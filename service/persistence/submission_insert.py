"""The write of a new submission: its verification row and its "submitted" event, or nothing when the
submitter's idempotency key is taken. The hottest write the API makes, so it is Core SQL on the tables,
executed with parameters: on Postgres ONE statement (the event is inserted from the verification
insert's RETURNING, in a CTE), which halved a submission's database CPU and wall time against an ORM
insert plus a second INSERT (scripts/bench_api.py); SQLite cannot put an INSERT in a WITH, so two. The API
runs the Postgres statement on the driver (`insert_queued_on_driver`, `service.persistence.driver`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Integer, String, Table, bindparam, insert, literal, null, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.sql.dml import Insert

from service.lifecycle import Reason, State
from service.persistence import driver
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


async def insert_queued_on_driver(connection: psycopg.AsyncConnection[Any], row: dict[str, Any]) -> bool:
    """`insert_queued` on Postgres, on a connection `driver.borrowed` lent: the same one statement, committed
    when it returns (the connection is in autocommit)."""
    statement = driver.compiled(_with_event(tuple(sorted(row))))
    return await driver.first_row(connection, statement, row) is not None


@functools.cache  # one statement per set of columns written (optional ones are left out when unset)
def _with_event(columns: tuple[str, ...]) -> Insert:
    new = (postgresql.insert(_VERIFICATIONS)
           .values({name: bindparam(name, type_=_VERIFICATIONS.c[name].type) for name in columns})
           .on_conflict_do_nothing().returning(_VERIFICATIONS.c.id).cte("new"))
    event = select(new.c.id, bindparam("created_at", type_=_EVENTS.c.at.type), null(),
                   literal(State.QUEUED.value, String()), literal(0, Integer()), literal("submitted", String()),
                   literal(Reason.SUBMITTED.value, String()))
    return insert(_EVENTS).from_select(_EVENT_COLUMNS, event).returning(_EVENTS.c.verification_id)


_SQLITE_UNLESS_KNOWN = sqlite.insert(_VERIFICATIONS).on_conflict_do_nothing().returning(_VERIFICATIONS.c.id)
_SQLITE_EVENT = insert(_EVENTS)
