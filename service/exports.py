"""Every verdict under the auditor's filters, as JSON Lines or CSV, in constant memory: rows are read
one keyset page at a time (`service.persistence.exports`) and each page is encoded before the next is
read, so the server holds one page, whatever the export's size. With attestations each row carries its
signed DSSE envelope and its SLSA verification summary, so a recipient can check every verdict without
trusting this database.

A stored row that cannot be exported (unreadable JSON, a NaN, text that is not Unicode: what input
validation now refuses, but an older row may hold) never ends the export: it becomes a marker line
naming its id, and a last line counts the rows skipped."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.engine import Row
from sqlalchemy.orm import Session, sessionmaker

from service.attestations import attestation_for
from service.attestations.issue import vsa_for
from service.config import Settings
from service.persistence import exports as export_queries
from service.persistence.clock import as_utc
from service.persistence.db import read_transaction, transaction
from service.persistence.models import Verification
from service.reading import ListFilters, with_verdict

Format = Literal["jsonl", "csv"]
MEDIA_TYPES: dict[Format, str] = {"jsonl": "application/x-ndjson", "csv": "text/csv; charset=utf-8"}
FIELDS = ("id", "created_at", "finished_at", "verdict", "blockers", "artifact_sha256", "artifact_uri", "source_uri",
          "submitted_by", "policy_origin", "policy_version", "policy_sha256", "attempt", "reused_from")
BATCH_ROWS = 1000  # rows per keyset page: one page is all the server holds
ATTESTED_BATCH_ROWS = 100  # with envelopes, each row is a few KB more
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet runs such a cell (CSV injection)
SKIPPED = "skipped: the stored row cannot be exported"
# What encoding a record raises for a value JSON or UTF-8 cannot hold (UnicodeEncodeError is a ValueError).
UNENCODABLE = (ValueError, TypeError)
log = logging.getLogger(__name__)


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else as_utc(moment).isoformat()


def record_of(row: Row[Any]) -> dict[str, Any]:
    """One exported verdict, with the values GET /v1/verifications shows for the same verification."""
    return {"id": row.id, "created_at": _iso(row.created_at), "finished_at": _iso(row.finished_at),
            "verdict": row.verdict, "blockers": list(row.blockers), "artifact_sha256": row.artifact_sha256,
            "artifact_uri": row.artifact_uri, "source_uri": row.source_uri, "submitted_by": row.submitted_by,
            "policy_origin": row.policy_origin or "unrecorded", "policy_version": row.policy_version,
            "policy_sha256": row.policy_sha256, "attempt": row.attempt, "reused_from": row.reused_from}


def _cell(value: Any) -> str:
    """A CSV cell: lists space-separated, JSON objects compact, None empty, formulas defused. A number that
    is not finite is refused (ValueError), as in JSON Lines: both formats skip the same rows."""
    if value is None:
        return ""
    if isinstance(value, list):
        value = " ".join(_finite(item) for item in value)
    elif isinstance(value, dict):
        value = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    text = _finite(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def _finite(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("not a finite number")
    return str(value)


def csv_lines(records: Iterable[dict[str, Any]], fields: tuple[str, ...]) -> bytes:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerows([_cell(record.get(field)) for field in fields] for record in records)
    return buffer.getvalue().encode()


def jsonl_lines(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
                   for record in records).encode()


def marker(ident: str) -> dict[str, Any]:
    """What stands in for a row that cannot be exported (a record with `skipped` and no verdict)."""
    return {"id": ident, "skipped": SKIPPED}


def _encode(records: list[dict[str, Any]], fmt: Format, fields: tuple[str, ...]) -> bytes:
    """CSV rows (a marker's reason in the verdict column) or JSON Lines."""
    if fmt == "jsonl":
        return jsonl_lines(records)
    return csv_lines([{"id": r["id"], "verdict": r["skipped"]} if "skipped" in r else r for r in records], fields)


def encoded_page(records: list[dict[str, Any]], fmt: Format, fields: tuple[str, ...]) -> tuple[bytes, int]:
    """The page's bytes and how many of its rows were skipped. The page at once while it encodes; else
    record by record, each one that cannot be encoded replaced by its marker."""
    skipped = sum(1 for record in records if "skipped" in record)
    try:
        return _encode(records, fmt, fields), skipped
    except UNENCODABLE:
        pass
    chunks = []
    for record in records:
        try:
            chunks.append(_encode([record], fmt, fields))
        except UNENCODABLE:
            log.warning("verification %s: its stored values cannot be exported", record["id"])
            chunks.append(_encode([marker(record["id"])], fmt, fields))
            skipped += 1
    return b"".join(chunks), skipped


def trailer(skipped: int, fmt: Format, fields: tuple[str, ...]) -> bytes:
    """The last line of an export that skipped rows: how many."""
    if fmt == "jsonl":
        return jsonl_lines([{"skipped_rows": skipped}])
    return csv_lines([{"verdict": f"skipped rows: {skipped}"}], fields)


Page = tuple[list[dict[str, Any]], export_queries.Keyset | None]


def _page(factory: sessionmaker[Session], settings: Settings, filters: ListFilters,
          after: export_queries.Keyset | None, limit: int, with_attestation: bool) -> Page:
    """One page of records and the keyset after it (None: this was the last page), in a short transaction
    of its own: a read, unless attestations are signed and stored on the way."""
    with (transaction if with_attestation else read_transaction)(factory) as session:
        rows = export_queries.verdict_page(session, filters, after=after, limit=limit)
        records = [marker(row.id) if isinstance(row, export_queries.Unreadable) else record_of(row) for row in rows]
        if with_attestation:
            records = [_attested(session, settings, record) for record in records]
    last = (rows[-1].created_at, rows[-1].id) if len(rows) == limit else None
    return records, last


def _attested(session: Session, settings: Settings, record: dict[str, Any]) -> dict[str, Any]:
    """The record with its envelope; its marker when the stored row cannot be read to sign it."""
    if "skipped" in record:
        return record
    try:
        verification = with_verdict(session, record["id"])
        envelope = attestation_for(session, settings, verification) if verification else None
        summary = _vsa(session, settings, verification) if verification else None
    except export_queries.UNREADABLE:
        session.rollback()
        return marker(record["id"])
    finally:
        session.expunge_all()  # one row's objects at a time
    return record | {"attestation": envelope, "vsa": summary}


def _vsa(session: Session, settings: Settings, verification: Verification) -> dict[str, Any] | None:
    """The row's SLSA verification summary; None for a report too old to name its policy's hash."""
    try:
        return vsa_for(session, settings, verification)
    except ValueError:
        return None


def verdict_chunks(factory: sessionmaker[Session], settings: Settings, filters: ListFilters, fmt: Format, *,
                   with_attestation: bool) -> Iterator[bytes]:
    """The export, one encoded page per chunk, each page read only when the previous one was written."""
    fields = (*FIELDS, "attestation", "vsa") if with_attestation else FIELDS
    if fmt == "csv":
        yield csv_lines([dict(zip(fields, fields, strict=True))], fields)
    limit = min(BATCH_ROWS, ATTESTED_BATCH_ROWS) if with_attestation else BATCH_ROWS
    after: export_queries.Keyset | None = None
    skipped = 0
    while True:
        records, after = _page(factory, settings, filters, after, limit, with_attestation)
        if records:
            chunk, skipped_here = encoded_page(records, fmt, fields)
            skipped += skipped_here
            yield chunk
        if after is None:
            break
    if skipped:
        log.warning("the verdict export skipped %d rows that cannot be exported", skipped)
        yield trailer(skipped, fmt, fields)
