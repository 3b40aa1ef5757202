"""Gate 1 with a mixture-of-experts importance matrix: each expert of a stacked 3-D tensor is quantized
with its own imatrix row (the sums over the tokens the router sent to it), and the verifier must weigh
every expert slice separately to reproduce the file byte for byte.

The fixtures (scripts/fixtures_imatrix_moe.py) quantize a tiny qwen3moe (4 experts, top-2, 2 layers)
with `llama_model_quantize` and a per-expert imatrix computed from the HF model over examples/english.txt
("numbers" is another text set), written in both of llama.cpp's forms."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engine.formats.gguf_structure import read_layout
from engine.policy import Policy
from engine.quant.imatrix import read_imatrix
from engine.report import Report
from engine.verification import LocalInputs, VerifyRequest, verify
from tests.conftest import codes

# every imatrix path runs through the process pool as well as in one process
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("gate1_processes")]
N_EXPERT, N_LAYER = 4, 2
STACKED = {f"blk.{layer}.ffn_{proj}_exps.weight" for layer in range(N_LAYER) for proj in ("gate", "up", "down")}
WEIGHTED = 7 * N_LAYER  # q, k, v, output and the three stacked expert tensors of each block
QUANTIZED = {"Q4_K_M": {"Q4_K", "Q6_K"}, "IQ4_XS": {"IQ4_XS", "Q6_K"}, "IQ2_XXS": {"IQ2_XXS", "Q4_K", "Q5_K"}}


def run(fixture: Path, artifact: str, imatrix: Path | None) -> Report:
    """Gate 1 on `artifact` against the fixture's source with `imatrix`, under the default policy."""
    inputs = LocalInputs(source=fixture / "source", artifact=fixture / artifact, imatrix=imatrix)
    return verify(VerifyRequest(gates=frozenset({1})), inputs, Policy())


def quantized_rows(report: Report) -> dict[str, dict]:
    rows = report.gates["storage"].details["tensors"]
    return {row["gguf_name"]: row for row in rows if row["gguf_type"] not in ("F32", "F16")}


def failed(report: Report) -> set[str]:
    return {name for name, row in quantized_rows(report).items() if row["mismatched"]}


def edited_imatrix(src: Path, dst: Path, tensor: str, edit: Callable[[np.ndarray, np.ndarray], None]) -> Path:
    """A copy of the GGUF imatrix `src` in which `edit` changed `tensor`'s per-expert sums [n_expert, ne0] and
    counts [n_expert, 1] in place (everything else, sizes included, unchanged)."""
    shutil.copyfile(src, dst)
    layout = read_layout(dst)
    parts = []
    for part in ("in_sum2", "counts"):
        info = layout.tensor(f"{tensor}.{part}")
        parts.append(np.memmap(dst, dtype="<f4", mode="r+", offset=info.offset,
                               shape=(N_EXPERT, info.n_elements // N_EXPERT)))
    edit(*parts)
    for values in parts:
        values.flush()
    return dst


def test_the_moe_imatrix_has_one_row_and_one_count_per_expert_in_both_forms(imatrix_moe):
    """MUL_MAT_ID-shaped entries: [ne0, n_expert] sums and n_expert counts adding up to top-2 of the tokens,
    every expert reached, distinct weight rows, and the same weights read from either form."""
    path = imatrix_moe / "imatrix-english.gguf"
    matrix, legacy, layout = read_imatrix(path), read_imatrix(imatrix_moe / "imatrix-english.dat"), read_layout(path)
    tokens = matrix.chunk_count * matrix.chunk_size
    for name in STACKED:
        counts = np.fromfile(path, dtype="<f4", count=N_EXPERT, offset=layout.tensor(f"{name}.counts").offset)
        assert counts.sum() == 2 * tokens and (counts > 0).all(), (name, counts)
        weights = matrix.weights_for(name, (256, 256, N_EXPERT))
        assert weights is not None and weights.shape == (N_EXPERT, 256)
        assert len({row.tobytes() for row in weights}) == N_EXPERT
        assert np.array_equal(legacy.weights_for(name, (256, 256, N_EXPERT)), weights)


@pytest.mark.coverage(arch="qwen3moe", types=("Q4_K_M", "IQ4_XS", "IQ2_XXS"), imatrix=True, proves="GO", gates="1")
@pytest.mark.parametrize(("qtype", "form"), [("Q4_K_M", "gguf"), ("IQ4_XS", "dat"), ("IQ2_XXS", "gguf")])
def test_a_moe_imatrix_quant_is_reproduced_expert_by_expert_with_its_imatrix(imatrix_moe, qtype, form):
    """Gate 1 re-quantizes each expert slice with its own imatrix row and matches every block. (Gates 2 and 3
    also pass on these files, but the HF MoE forward makes that ~10 s, so the suite runs gate 1 only.)"""
    matrix = imatrix_moe / f"imatrix-english.{form}"
    artifact = f"{qtype}-imat.gguf" if form == "gguf" else f"{qtype}-imat-dat.gguf"
    report = run(imatrix_moe, artifact, matrix)
    assert report.verdict == "GO", report.blockers
    rows = quantized_rows(report)
    assert {row["gguf_type"] for row in rows.values()} == QUANTIZED[qtype]
    assert all(row["check"] == "reproduced" and row["mismatched"] == 0 for row in rows.values()), rows
    assert set(rows) >= STACKED and len(rows) == WEIGHTED + 1  # and token_embd, which has no entry
    assert {rows[name]["gguf_type"] for name in STACKED} <= {"Q4_K", "Q6_K", "IQ4_XS", "IQ2_XXS"}  # imatrix-weighted
    for name in STACKED:  # every expert slice of every stacked tensor was re-quantized and matched
        assert rows[name]["shape"] == [N_EXPERT, 256, 256] and rows[name]["blocks"] == N_EXPERT * 256
    named = report.gates["storage"].details["imatrix"]
    assert named["format"] == form and named["sha256"] == hashlib.sha256(matrix.read_bytes()).hexdigest()
    assert named["tensors_weighted"] == WEIGHTED and named["entries"] == WEIGHTED + N_LAYER  # + ffn_gate_inp


@pytest.mark.parametrize("qtype", ["Q4_K_M", "IQ2_XXS"])
def test_without_its_imatrix_the_moe_file_is_not_reproduced_rather_than_mismatched(imatrix_moe, qtype):
    """No defect code: K-quant expert stacks differ systematically (every block of every weighted tensor),
    IQ2_XXS ones cannot be re-quantized at all; both say to supply the imatrix, the per-type bound holds,
    and the default policy keeps it NO-GO."""
    report = run(imatrix_moe, f"{qtype}-imat.gguf", None)
    assert report.verdict == "NO-GO" and codes(report) == {"tensor.not_reproduced"}, report.blockers
    assert all("supply the imatrix" in b.why for b in report.blockers)
    rows = quantized_rows(report)
    for name in STACKED:
        systematic = rows[name]["check"] == "reproduced" and rows[name]["mismatched"] == rows[name]["blocks"]
        assert systematic or rows[name]["not_reproduced"], rows[name]
        assert not rows[name]["bound_violations"], rows[name]
    assert "token_embd.weight" not in failed(report)  # no imatrix entry: quantized without weights, reproduces


@pytest.mark.coverage(arch="qwen3moe", types=("Q4_K_M",), imatrix=True, proves="NO-GO", gates="1",
                      defect="quantized with another imatrix")
def test_the_wrong_moe_imatrix_fails_reproduction(imatrix_moe):
    report = run(imatrix_moe, "Q4_K_M-imat.gguf", imatrix_moe / "imatrix-numbers.gguf")
    assert report.verdict == "NO-GO"
    assert codes(report) == {"tensor.other_quantizer"}, report.blockers
    assert all("quantized with another imatrix" in b.why for b in report.blockers)
    assert failed(report) >= STACKED and len(failed(report)) == WEIGHTED


def _one_expert_takes_the_next_ones_row(sums: np.ndarray, counts: np.ndarray) -> None:
    sums[2], counts[2] = sums[3].copy(), counts[3].copy()


def _experts_in_reverse_order(sums: np.ndarray, counts: np.ndarray) -> None:
    sums[:], counts[:] = sums[::-1].copy(), counts[::-1].copy()


@pytest.mark.coverage(arch="qwen3moe", types=("Q4_K_M",), imatrix=True, proves="NO-GO", gates="1",
                      defect="one expert weighted by another expert's imatrix row")
@pytest.mark.parametrize(("tensor", "edit", "one_expert"), [
    ("blk.1.ffn_gate_exps.weight", _one_expert_takes_the_next_ones_row, True),
    ("blk.0.ffn_down_exps.weight", _experts_in_reverse_order, False)])
def test_an_expert_weighted_with_another_experts_row_is_not_reproduced(imatrix_moe, tmp_path, tensor, edit,
                                                                        one_expert):
    """Only that stacked tensor fails, and only in the experts whose row moved: the verifier weighs each
    expert slice with its own row, not one row for the whole tensor."""
    matrix = edited_imatrix(imatrix_moe / "imatrix-english.gguf", tmp_path / "edited.gguf", tensor, edit)
    report = run(imatrix_moe, "Q4_K_M-imat.gguf", matrix)
    assert report.verdict == "NO-GO"
    assert codes(report) == {"tensor.reproduction_mismatch"}, report.blockers
    assert failed(report) == {tensor} and {b.tensor for b in report.blockers} == {tensor}
    mismatched = quantized_rows(report)[tensor]["mismatched"]
    assert 0 < mismatched <= 256 if one_expert else mismatched > 256, mismatched  # an expert slice: 256 blocks
