"""The readers of a report (the CLI summary, the Markdown report and model card, the attestation statement)
against every golden report: each reads the gates' details through the typed evidence of
`engine/evidence.py`, so a figure a gate leaves out (top-1 agreement when no position is decisive) is a
line left out, never a KeyError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.evidence import release_details, runtime_details, storage_details
from engine.report import Report
from engine.summary import render_summary as summary
from service.report_render import model_card, to_markdown

GOLDEN = Path(__file__).resolve().parents[1] / "integration" / "golden"


def restored(path: Path) -> dict[str, Any]:
    """A golden report with the run-dependent fields the golden file leaves out put back."""
    report = json.loads(path.read_text())
    report.update(environment={"convgate": "0"}, timings={})
    for gate in report["gates"].values():
        gate["seconds"] = 0.0
    for control in report["controls"]:
        control["seconds"] = 0.0
    return report


GOLDENS = sorted(GOLDEN.glob("*.json"))


@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_every_reader_reads_every_golden_report(path: Path) -> None:
    report = restored(path)
    text = summary(Report.model_validate(report))
    assert text.splitlines()[-1] == report["verdict"]
    assert report["verdict"] in to_markdown("v", report)
    assert model_card(report)


@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_the_details_every_gate_writes_are_its_typed_evidence(path: Path) -> None:
    gates = restored(path)["gates"]
    readers = {"storage": storage_details, "runtime": runtime_details, "release": release_details}
    for name, gate in gates.items():
        readers[name](gate["details"])  # raises on a field of another type than the readers expect


def test_logits_without_a_decisive_position_are_summarised_without_a_top1_figure() -> None:
    """All near-ties (a tiny random model, the 7B-shaped random one): no top-1 agreement is counted."""
    report = restored(GOLDEN / "tiny-llama-Q8_0.json")
    logits = report["gates"]["runtime"]["details"]["logits"]["summary"]
    assert logits["decisive_positions"] == 0 and "top1_agreement" not in logits
    text = summary(Report.model_validate(report))
    assert "top-1 agreement" not in text and "0 decisive" in text
    assert "NMSE" in to_markdown("v", report)
