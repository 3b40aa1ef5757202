"""Every page template escapes whatever it is given: each one rendered with a hostile string in every
field it shows, and no template able to opt out (no `|safe`, no autoescape switch, no Markup built from
a value). The API-level tests (test_queue_page, test_auditor_page, test_api) drive the same through
real requests; this one covers every template, including ones a request seldom reaches."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from markupsafe import escape

from service.report_render import to_html
from service.schemas import QueueEstimate
from service.templating import ENVIRONMENT, render

HOSTILE = "\"'><script>alert(1)</script><img src=x onerror=alert(2)>"
TEMPLATES = Path(__file__).parents[2] / "service" / "templates"
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _queue_item() -> SimpleNamespace:
    return SimpleNamespace(id=HOSTILE, state=HOSTILE, attempt=1, wait_seconds=3.0, run_seconds=None,
                           progress={"done": HOSTILE, "total": HOSTILE, "stage": HOSTILE}, cluster_status=HOSTILE,
                           queue_position=2, worker=HOSTILE, failed_attempts=0, reason=HOSTILE,
                           submitted_by=HOSTILE, artifact_uri=HOSTILE, source_uri=HOSTILE,
                           estimated_start_seconds=90.0)


def _snapshot() -> dict[str, object]:
    finished = {"id": HOSTILE, "verdict_result": None, "state": HOSTILE, "artifact_uri": HOSTILE,
                "source_uri": HOSTILE, "submitted_by": HOSTILE, "first_blocker": HOSTILE, "reason": HOSTILE,
                "ago": 5.0, "waited": 1.0, "ran": 2.0}
    verdict = finished | {"verdict_result": HOSTILE}
    return {"rendered": 1, "counts": [(HOSTILE, 1)], "oldest": SimpleNamespace(id=HOSTILE, age_seconds=1.0),
            "dispatcher": HOSTILE, "active": [_queue_item()], "active_head": (HOSTILE,),
            "finished_head": (HOSTILE,), "finished": [finished, verdict],
            "estimate": QueueEstimate(runs=3, median_run_seconds=60.0, parallel=2, fixed_seconds=20.0,
                                      seconds_per_gib=40.0, replayed_runs=5, median_abs_error_seconds=7.0,
                                      p90_abs_error_seconds=30.0)}


def _auditor() -> dict[str, object]:
    row = SimpleNamespace(id=HOSTILE, verdict_result=HOSTILE, state=HOSTILE, created_at=NOW, artifact_uri=HOSTILE,
                          source_uri=HOSTILE, artifact_sha256=HOSTILE, submitted_by=HOSTILE, policy_origin=HOSTILE)
    return {"values": dict.fromkeys(("artifact_sha256", "source_uri", "verdict", "since", "until", "policy"),
                                    HOSTILE), "errors": [], "rows": [row],
            "export_links": {"csv": HOSTILE, "jsonl": HOSTILE}, "next_link": HOSTILE}


CONTEXTS: dict[str, dict[str, object]] = {
    "login.html": {"title": HOSTILE, "message": HOSTILE, "next_page": HOSTILE},
    "message.html": {"title": HOSTILE, "message": HOSTILE},
    "queue.html": {"title": HOSTILE, **_snapshot()},
    "queue_snapshot.html": _snapshot(),
    "model_cell.html": {"artifact_uri": HOSTILE, "source_uri": HOSTILE},
    "auditor.html": {"title": HOSTILE, **_auditor()},
    "auditor-errors": {"title": HOSTILE, **_auditor(), "errors": [HOSTILE]},
    "report.html": {"verification_id": HOSTILE, "body": HOSTILE},
}


def test_every_template_is_rendered_here() -> None:
    pages = {path.name for path in TEMPLATES.glob("*.html")} - {"base.html"}  # rendered by every page above
    assert pages | {"base.html"} == set(ENVIRONMENT.list_templates(extensions=["html"]))
    assert pages == {
        name for name in CONTEXTS if name.endswith(".html")}


@pytest.mark.parametrize("case", sorted(CONTEXTS))
def test_a_hostile_string_in_every_field_is_shown_escaped_never_as_markup(case: str) -> None:
    name = case if case.endswith(".html") else case.split("-", maxsplit=1)[0] + ".html"
    page = render(name, **CONTEXTS[case])
    assert HOSTILE not in page and "<script>alert" not in page and "<img src=x" not in page
    assert str(escape(HOSTILE)) in page  # shown, as text


def test_no_template_can_opt_out_of_escaping() -> None:
    for path in TEMPLATES.iterdir():
        text = path.read_text()
        assert not re.search(r"\|\s*safe\b|autoescape\s+false|Markup", text), path.name


def test_a_rendered_report_escapes_every_submitted_string() -> None:
    report = {"verdict": "NO-GO", "artifact": {"uri": HOSTILE, "sha256": HOSTILE},
              "gates": {HOSTILE: {"status": HOSTILE, "seconds": 1.0}},
              "blockers": [{"code": HOSTILE, "gate": HOSTILE, "tensor": HOSTILE, "why": HOSTILE}],
              "policy": {"values": {"version": HOSTILE}, "sha256": HOSTILE},
              "files": [{"uri": HOSTILE, "sha256": HOSTILE, "size": HOSTILE}], "not_verified": [HOSTILE]}
    page = to_html(HOSTILE, report, HOSTILE)
    assert "<script>alert" not in page and "<img src=x" not in page and HOSTILE not in page
