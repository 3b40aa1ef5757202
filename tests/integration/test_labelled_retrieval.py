"""Embeddings as applications use them (issue 37), on the trained all-MiniLM-L6-v2 and llama.cpp's own
conversions: the labelled retrieval set at the full width and at served Matryoshka widths.

- An honest Q4_K_M is GO at 384, 128 and 64 dimensions, and the report gives recall@1, recall@10 and nDCG@10
  of the reference, llama.cpp and the source at each, the decisive pairs and the near-ties.
- A twin whose last layer norm flips the sign of one output dimension among the first 64 keeps every full-width
  cosine to the source above the 0.99 floor, so at full width it passes; served at 64 dimensions it is NO-GO,
  and the blocker names the width. (A float twin: the correctness reference runs the same weights, so the gap
  to the source is what finds it.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from engine.policy import Policy
from service.cli import app
from tests.conftest import codes, defect_copy, run_gates

pytestmark = pytest.mark.slow

TEXTS = ("The quick brown fox jumps over the lazy dog.", "Platform teams gate every model before it ships.")
SERVED = Policy(embedding_widths=(128, 64), long_context_tokens=1024)
FLIPPED_DIMENSION = 10


def _labelled(report) -> dict:
    return report.gates["runtime"].details["embeddings"]["labelled_retrieval"]


@pytest.mark.coverage(arch="bert (MiniLM, trained)", types=("Q4_K_M",), imatrix=False, proves="GO", gates="2,3")
def test_an_honest_q4_k_m_is_go_at_every_served_width_with_its_retrieval_figures(minilm: Path):
    report = run_gates(minilm / "source", minilm / "minilm-Q4_K_M.gguf", {2, 3}, SERVED, texts=TEXTS)
    assert report.verdict == "GO", [(b.code, b.why[:200]) for b in report.blockers]
    labelled = _labelled(report)
    assert list(labelled["widths"]) == ["384", "128", "64"] and labelled["queries"] >= 60
    for width, figures in labelled["widths"].items():
        for side in ("reference", "candidate", "source"):
            assert set(figures[side]) == {"recall_at_1", "recall_at_10", "ndcg_at_10"}, width
        assert figures["source"]["ndcg_at_10"] > 0.5  # the set is answerable by the trained model
        assert figures["decisive"] > 0 and not figures["swapped"]
    assert set(labelled["languages"]) >= {"en", "de", "es"}
    # gate 3 re-measured the released file's built-in top-1 at each served width
    assert set(report.gates["release"].details["top1_at"]) == {"128", "64"}


def _flip_one_dimension(raw: np.ndarray) -> None:
    values = raw.view("<f4")
    values[FLIPPED_DIMENSION] = -values[FLIPPED_DIMENSION]


@pytest.mark.coverage(arch="bert (MiniLM, trained)", types=("F32",), imatrix=False, proves="NO-GO", gates="2",
                      defect="one output dimension of the last layer norm negated")
def test_a_defect_the_full_width_hides_is_no_go_at_64_dimensions_naming_the_width(minilm: Path, tmp_path: Path):
    twin = defect_copy(minilm / "minilm-F32.gguf", tmp_path, "blk.5.layer_output_norm.weight", _flip_one_dimension)
    twin = defect_copy(twin, tmp_path, "blk.5.layer_output_norm.bias", _flip_one_dimension)
    full_only = run_gates(minilm / "source", twin, {2}, Policy(long_context_tokens=1024), texts=TEXTS)
    overall = full_only.gates["runtime"].details["quality"]["slices"]["overall"]
    assert overall["min_cosine"] > 0.99 and full_only.verdict == "GO", full_only.blockers
    served = run_gates(minilm / "source", twin, {2}, SERVED, texts=TEXTS)
    assert "quality.cosine_below_budget" in codes(served)
    named = [b.why for b in served.blockers if b.code == "quality.cosine_below_budget"]
    assert named and all(why.startswith("at 64 dimensions") or why.startswith("at 128 dimensions")
                         for why in named), named
    assert any(why.startswith("at 64 dimensions") for why in named)


@pytest.mark.parametrize("gguf_type", ["F16", "Q8_0"])
def test_tiny_encoders_compare_long_documents_cut_at_their_context_on_both_sides(xlm_roberta: Path, modernbert: Path,
                                                                                 gguf_type: str):
    """Long inputs at the context limit on the tiny models (issue 37, item 4): each long document is cut at the
    last word both tokenizers fit in the context, and the honest files are GO at 16 dimensions too."""
    for root in (xlm_roberta, modernbert):
        report = run_gates(root / "source", root / f"{gguf_type}.gguf", {2},
                           Policy(embedding_widths=(16,), long_context_tokens=1024), texts=TEXTS[:1])
        assert report.verdict == "GO", (root.name, report.blockers)
        labelled = _labelled(report)
        assert labelled["passages_cut_to_the_context"] >= 5 and list(labelled["widths"])[-1] == "16"


def test_a_submitters_own_labelled_set_is_measured_instead_of_the_built_in_one(minilm: Path, tmp_path: Path):
    """`--labelled-set` (and the API's `labelled_set`): the report names the submitted set and its figures; a
    file that is not a labelled set is exit 2 (could not run), naming what is wrong."""
    labelled = {"passages": [{"id": "bread", "text": "Bread rises because yeast turns sugar into gas."},
                             {"id": "river", "text": "Rivers carry sediment from the mountains to the sea."},
                             {"id": "oven", "text": "An oven bakes bread at about two hundred degrees."}],
                "queries": [{"id": "q1", "language": "en", "text": "why does bread rise", "relevant": ["bread"],
                             "hard_negatives": ["oven", "river"]},
                            {"id": "q2", "language": "en", "text": "where does river sediment go",
                             "relevant": ["river"], "hard_negatives": ["bread", "oven"]}]}
    path = tmp_path / "labelled.json"
    path.write_text(json.dumps(labelled))
    out = tmp_path / "report.json"
    args = ["verify", "--source", str(minilm / "source"), "--artifact", str(minilm / "minilm-F16.gguf"),
            "--gates", "2", "--report", str(out)]
    result = CliRunner().invoke(app, [*args, "--labelled-set", str(path)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())["gates"]["runtime"]["details"]["embeddings"]["labelled_retrieval"]
    assert figures["set"] == "submitted (labelled.json)" and figures["queries"] == 2 and figures["passages"] == 3
    assert figures["widths"]["384"]["source"]["recall_at_1"] == 1.0
    path.write_text(json.dumps({"passages": [], "queries": []}))
    refused = CliRunner().invoke(app, [*args, "--labelled-set", str(path)])
    assert refused.exit_code == 2 and "--labelled-set" in refused.output
