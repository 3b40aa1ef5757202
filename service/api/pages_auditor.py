"""The auditor page and the pages' links: search verdicts with a plain HTML form (GET, so a search is a
URL to bookmark or share), open a verdict's rendered report, download its signed attestation and
export the search as CSV or JSON Lines. Signed in like the operator page (the `/ui` cookie, GET
reads only); operators, auditors and admins may use it. Every read is in the access log, as through
the API."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from service import reading
from service.api import access_log, exports
from service.api.deps import Principal, SettingsDep
from service.api.pages_html import message_page, page_principal
from service.api.units import one_trip
from service.attestations import KeyFileError, attestation_for
from service.persistence.clock import in_utc
from service.persistence.cursors import InvalidCursorError
from service.persistence.models import Verification
from service.report_render import to_html
from service.schemas import UUID_PATTERN
from service.templating import render

router = APIRouter(prefix="/ui")
PAGE = "/ui/auditor"
PAGE_ROWS = 50
SHA256 = re.compile(r"[0-9a-f]{64}")
POLICY_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,63}")
PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]*")
SEARCH_FIELDS = ("artifact_sha256", "source_uri", "verdict", "since", "until", "policy")
SearchText = Annotated[str, Query(max_length=4096)]
VerificationId = Annotated[str, Path(pattern=UUID_PATTERN)]
HTML_PAGE = {"content": {"text/html": {"schema": {"type": "string"}}}}
PAGE_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "a search this page cannot run, and why", **HTML_PAGE},
    401: {"description": "not signed in: the sign-in form", **HTML_PAGE},
    403: {"description": "a role that may not search verdicts", **HTML_PAGE},
    404: {"description": "no such verification, or no verdict yet", **HTML_PAGE},
    503: {"description": "the signing key cannot be loaded", **HTML_PAGE}}


def _moment(value: str) -> datetime:
    """A form's date and time (a datetime-local input sends no zone: UTC is meant), or full ISO 8601, as an
    instant in UTC (ValueError also for one its offset carries outside year 1..9999)."""
    if not re.match(r"\d{4}-\d{2}-\d{2}", value):
        raise ValueError(value)
    try:
        return in_utc(datetime.fromisoformat(value))
    except OverflowError as exc:
        raise ValueError(value) from exc


def parse_search(values: dict[str, str]) -> tuple[reading.ListFilters, list[str]]:
    """The form's values as filters, and what is wrong with them. An empty field is no filter: a plain
    form sends every field, filled or not."""
    given = {key: values.get(key, "").strip() for key in SEARCH_FIELDS}
    errors = []
    if given["artifact_sha256"] and not SHA256.fullmatch(given["artifact_sha256"]):
        errors.append("artifact sha256: 64 lowercase hex digits")
    if given["verdict"] not in ("", "GO", "NO-GO"):
        errors.append("verdict: GO or NO-GO")
    if given["policy"] and not POLICY_NAME.fullmatch(given["policy"]):
        errors.append("policy: the name of a configured policy")
    if not PRINTABLE.fullmatch(given["source_uri"]):
        errors.append("source: printable characters only")
    moments: dict[str, datetime | None] = {}
    for key in ("since", "until"):
        try:
            moments[key] = _moment(given[key]) if given[key] else None
        except ValueError:
            errors.append(f"{key}: a date and time, e.g. 2026-11-30T12:00 (UTC)")
    filters = reading.ListFilters(given["artifact_sha256"] or None, given["source_uri"] or None,
                                     given["verdict"] or None, since=moments.get("since"), until=moments.get("until"),
                                     policy=given["policy"] or None)
    return filters, errors


def _link(path: str, query: str, extra: dict[str, str]) -> str:
    return f"{path}?{query}{'&' if query else ''}{urlencode(extra)}"


def _search_query(values: dict[str, str]) -> str:
    return urlencode([(key, values[key].strip()) for key in SEARCH_FIELDS if values.get(key, "").strip()])


@router.get("/auditor", response_class=HTMLResponse, response_model=None, responses=PAGE_RESPONSES)
async def auditor_page(request: Request, artifact_sha256: SearchText = "",
                       source_uri: SearchText = "", verdict: SearchText = "", since: SearchText = "",
                       until: SearchText = "", policy: SearchText = "",
                       cursor: Annotated[str | None, Query(max_length=256)] = None) -> HTMLResponse:
    """Newest first, a page at a time; every verdict links to its report and attestation."""
    values = {"artifact_sha256": artifact_sha256, "source_uri": source_uri, "verdict": verdict, "since": since,
              "until": until, "policy": policy}
    filters, errors = parse_search(values)
    query = _search_query(values)

    def page(session: Session) -> HTMLResponse:
        principal = page_principal(request, session, PAGE)
        if isinstance(principal, HTMLResponse):
            return principal
        rows: list[Verification] = []
        next_cursor = None
        if not errors:
            try:
                rows, next_cursor = reading.page(session, filters, limit=PAGE_ROWS, cursor=cursor)
            except InvalidCursorError:
                errors.append("the page link is not one this service made: search again")
        html = render("auditor.html", title="convgate verdicts", values=values, errors=errors, rows=rows,
                      export_links={fmt: _link("/ui/export", query, {"format": fmt}) for fmt in ("csv", "jsonl")},
                      next_link=_link(PAGE, query, {"cursor": next_cursor}) if next_cursor else None)
        if not errors:
            access_log.record(session, request, principal, "list_verifications")
        return HTMLResponse(html, status_code=400 if errors else 200)
    return await one_trip(request, page)


def _verdict_or_page(request: Request, session: Session,
                     verification_id: str) -> tuple[Principal, Verification] | HTMLResponse:
    principal = page_principal(request, session, PAGE)
    if isinstance(principal, HTMLResponse):
        return principal
    verification = reading.with_verdict(session, verification_id)
    if verification is None:
        return message_page("no such verification, or no verdict yet", 404)
    return principal, verification


@router.get("/verifications/{verification_id}/report", response_class=HTMLResponse, response_model=None,
            responses=PAGE_RESPONSES)
async def report_page(verification_id: VerificationId, request: Request) -> HTMLResponse:
    """The rendered report (GET /v1/verifications/{id}/report as text/html), for a signed-in browser."""
    def page(session: Session) -> HTMLResponse:
        found = _verdict_or_page(request, session, verification_id)
        if isinstance(found, HTMLResponse):
            return found
        principal, verification = found
        verdict = reading.verdict_of(session, verification)
        if verdict is None:
            return message_page("no verdict yet", 404)
        html = to_html(verification.id, verdict.report, verification.policy_origin)
        access_log.record(session, request, principal, "read_report", verification.id)
        return HTMLResponse(html)
    return await one_trip(request, page)


@router.get("/verifications/{verification_id}/attestation", response_model=None,
            responses={200: {"description": "the DSSE envelope, as a download",
                             "content": {"application/json": {"schema": {"type": "object"}}}}, **PAGE_RESPONSES})
async def attestation_download(verification_id: VerificationId, request: Request,
                               settings: SettingsDep) -> Response:
    """GET /v1/verifications/{id}/attestation's envelope, saved as `<id>.intoto.jsonl` by the browser."""
    def download(session: Session) -> Response:
        found = _verdict_or_page(request, session, verification_id)
        if isinstance(found, HTMLResponse):
            return found
        principal, verification = found
        try:
            envelope = attestation_for(session, settings, verification)
        except KeyFileError as exc:
            return message_page(f"attestation signing key: {exc}", 503)
        if envelope is None:
            return message_page("no verdict yet", 404)
        access_log.record(session, request, principal, "read_attestation", verification.id)
        return Response(json.dumps(envelope, separators=(",", ":")), media_type="application/json",
                        headers={"Content-Disposition": f'attachment; filename="{verification.id}.intoto.jsonl"'})
    return await one_trip(request, download)


@router.get("/export", response_model=None,
            responses={200: {"description": "the search's verdicts, as GET /v1/verdicts/export streams them",
                             "content": exports.EXPORT_TYPES}, **PAGE_RESPONSES})
async def export_download(request: Request, settings: SettingsDep,
                          artifact_sha256: SearchText = "", source_uri: SearchText = "", verdict: SearchText = "",
                          since: SearchText = "", until: SearchText = "", policy: SearchText = "",
                          format: exports.Format = "jsonl") -> Response:
    """The export of a search, for the page's download links (the API's export takes a bearer header)."""
    filters, errors = parse_search({"artifact_sha256": artifact_sha256, "source_uri": source_uri,
                                    "verdict": verdict, "since": since, "until": until, "policy": policy})

    def download(session: Session) -> Response:
        principal = page_principal(request, session, PAGE)
        if isinstance(principal, HTMLResponse):
            return principal
        if errors:
            return message_page("; ".join(errors), 400)
        return exports.stream_export(request, session, settings, principal, filters, format, with_attestation=False)
    return await one_trip(request, download)
