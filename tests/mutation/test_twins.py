"""The mutation sweep in the suite: sampled tensors (fixed seed), every metadata key, on small fixtures.

`scripts/mutation_sweep.py` runs the full sweep (every tensor). Every twin must be NO-GO with a
blocker naming what was changed; a miss is printed with the verdict's blockers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutation import gguf_edit
from tests.mutation.sweep import FIXTURES, sweep, tally

pytestmark = pytest.mark.slow

# the suite twins all but the 87 MiB BERT F16 (the full sweep script does that one too)
CASES = {name: where for name, where in FIXTURES.items() if name != "bert-embedding-F16"}


def test_the_editor_round_trips_byte_for_byte(qwen3: Path, tmp_path: Path) -> None:
    honest = qwen3 / "tiny-qwen3-Q8_0.gguf"
    copy = gguf_edit.write(gguf_edit.read(honest), tmp_path / "copy.gguf")
    assert copy.read_bytes() == honest.read_bytes()


TWIN_CLAIMS = {"qwen3-embedding": "qwen3", "llama-causal": "llama", "bert-embedding": "bert"}


def _twin_case(case: str) -> pytest.ParameterSet:
    """Each sweep case proves NO-GO on every twin of one fixture (see tests/mutation/twins.py)."""
    family, _, gguf_type = case.rpartition("-")
    claim = pytest.mark.coverage(arch=TWIN_CLAIMS[family], types=(gguf_type,), imatrix=False, proves="NO-GO",
                                 gates="1,2", defect="every sweep twin: key changed/added, one ulp or code, swap, "
                                                     "drop, duplicate")
    return pytest.param(case, marks=claim)


@pytest.mark.parametrize("case", [_twin_case(case) for case in sorted(CASES)])
def test_every_twin_is_caught_and_named(case: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    folder, name = CASES[case]
    fixture = {"tiny-qwen3": "qwen3", "tiny-llama": "tiny_llama", "minilm": "minilm"}[folder]
    root = request.getfixturevalue(fixture)
    outcomes = sweep(root / "source", root / name, tmp_path, sample=4)
    missed = [f"{o.twin.kind} {o.twin.describe}: {o.verdict} ({o.explanation})" for o in outcomes if not o.caught]
    counts = tally(outcomes)
    assert sum(c["caught"] for c in counts.values()) >= 20, counts
    assert not missed, "\n".join(missed)
