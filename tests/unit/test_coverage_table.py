"""The coverage table in docs/coverage.md is exactly what the suite's `coverage` marks claim."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from scripts import coverage_table
from tests.coverage_marks import claims_of


def _item(*marks: pytest.MarkDecorator) -> SimpleNamespace:
    return SimpleNamespace(nodeid="tests/x.py::test_x", iter_markers=lambda name: [m.mark for m in marks])


def _claim(arch: str, types: tuple[str, ...], proves: str = "GO", gates: str = "1,2", imatrix: bool = False,
           defect: str = "") -> dict:
    return {"arch": arch, "types": list(types), "imatrix": imatrix, "proves": proves, "test": f"t::{arch}{types}",
            "gates": gates, "defect": defect}


@pytest.fixture(scope="module")
def claims() -> list[dict]:
    return coverage_table.collect_claims()


def test_docs_table_is_generated_from_the_marks(claims):
    doc = coverage_table.TABLE_DOC.read_text(encoding="utf-8")
    generated = coverage_table.render(claims)
    assert coverage_table.current_table(doc) == generated, "run: python scripts/coverage_table.py --write"


def test_the_readmes_limitations_are_generated_from_the_same_marks(claims):
    """The README once listed as unsupported what the table showed covered: now both come from the marks."""
    readme = coverage_table.README.read_text(encoding="utf-8")
    found = coverage_table.between(readme, coverage_table.LIMITS_START, coverage_table.LIMITS_END)
    assert found == coverage_table.render_limitations(claims), "run: python scripts/coverage_table.py --write"


def test_limitations_name_the_types_and_architectures_gate_2_never_proved():
    limitations = coverage_table.render_limitations([
        _claim("llama", ("F16",), gates="1,2,3"), _claim("llama", ("IQ2_S",), gates="1"),
        _claim("phi3", ("F16",), gates="1,3"), _claim("llama (single tensors)", ("TQ1_0",), gates="1"),
        _claim("qwen2", ("Q4_0",), proves="NO-GO", defect="d")])
    assert "llama, phi3, qwen2" in limitations
    assert "gate 1 (storage) only, never through gate 2 (runtime): IQ2_S, TQ1_0." in limitations
    assert "through gate 2: phi3." in limitations  # single tensors are not a model


def test_the_table_lives_in_docs_coverage_md_alone():
    doc = coverage_table.TABLE_DOC.read_text(encoding="utf-8")
    assert (doc.count(coverage_table.START), doc.count(coverage_table.END)) == (1, 1)
    readme = (coverage_table.REPO / "README.md").read_text(encoding="utf-8")
    assert coverage_table.START not in readme and coverage_table.END not in readme


def test_each_type_is_listed_under_the_widest_gates_that_proved_it():
    table = coverage_table.render([
        _claim("llama", ("F16", "Q8_0"), gates="1"), _claim("llama", ("Q8_0",), gates="1,2"),
        _claim("llama", ("IQ4_XS",), imatrix=True, gates="1"),
        _claim("llama", ("F16",), proves="NO-GO", defect="one weight changed"),
    ])
    row = table.splitlines()[2]
    assert row == "| llama | Q8_0 (gates 1+2); F16 (gate 1) | IQ4_XS (gate 1) | one weight changed | 4 |"


def test_a_mark_without_its_outcome_or_defect_is_refused():
    good = pytest.mark.coverage(arch="qwen2", types=("F16",), imatrix=False, proves="GO")
    assert [c.types for c in claims_of(_item(good))] == [("F16",)]
    for bad in (pytest.mark.coverage(arch="qwen2", types=("F16",)),
                pytest.mark.coverage(arch="qwen2", types=("F16",), proves="NO-GO"),
                pytest.mark.coverage(arch="qwen2", proves="GO", typo=1)):
        with pytest.raises(pytest.UsageError):
            claims_of(_item(bad))
