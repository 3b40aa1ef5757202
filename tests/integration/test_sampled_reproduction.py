"""Sampled K-quant reproduction (policy `reproduce_sample`): declared in the report with its seed and
detection probability, GO on an honest file, NO-GO when a corrupted super-block is drawn, and a
corrupted block outside the sample shows the risk the report states (the default policy still
reproduces every block and catches it)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.policy import Policy
from engine.quant.sampling import block_sample
from tests.conftest import blocked_tensors, defect_copy, run_gate1

pytestmark = pytest.mark.slow
TENSOR = "blk.0.ffn_down.weight"  # Q4_K in minilm-Q4_K_M: 384 rows of 6 super-blocks
Q4_K_BYTES, QS_OFFSET = 144, 16
HALF = Policy(reproduce_sample=0.5)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_honest_file_sampled_is_go_and_the_sample_is_declared(minilm):
    artifact = minilm / "minilm-Q4_K_M.gguf"
    report = run_gate1(minilm / "source", artifact, Policy(reproduce_sample=0.25))
    assert report.verdict == "GO", report.blockers
    sampling = report.gates["storage"].details["sampling"]
    assert sampling["seed"] == report.artifact.sha256
    assert sampling["fraction"] == 0.25
    assert sampling["super_blocks_total"] == 6 * 384 * 6  # the four Q4_K and two Q6_K tensors
    assert 0.2 < sampling["super_blocks_reproduced"] / sampling["super_blocks_total"] < 0.3
    assert sampling["detection_probability"]["1"] == 0.25
    rows = {row["gguf_name"]: row for row in report.gates["storage"].details["tensors"]}
    assert rows[TENSOR]["sampled_from"] == 384 * 6 and rows[TENSOR]["blocks"] < 384 * 6
    assert rows["blk.0.attn_q.weight"]["sampled_from"] is None  # Q5_0: not a K-quant, fully reproduced
    assert any("caught with probability 0.25" in line for line in report.not_verified)


def test_full_reproduction_stays_the_default(minilm):
    report = run_gate1(minilm / "source", minilm / "minilm-Q4_K_M.gguf")
    assert report.gates["storage"].details["sampling"] is None
    assert all(row["sampled_from"] is None for row in report.gates["storage"].details["tensors"])


def _corrupted(minilm: Path, tmp_path: Path, want_in_sample: bool) -> Path:
    """A copy with one Q4_K code changed in the first block whose draw (from the copy's own digest)
    falls in (or out of) the half sample."""
    source = minilm / "minilm-Q4_K_M.gguf"
    n_blocks = 384 * 6
    for block in range(64):
        folder = tmp_path / f"{want_in_sample}-{block}"
        folder.mkdir()

        def flip(raw, block=block):
            raw[block * Q4_K_BYTES + QS_OFFSET + 5] ^= 0x01

        artifact = defect_copy(source, folder, TENSOR, flip)
        if block_sample(_sha256(artifact), TENSOR, n_blocks, 0.5)[block] == want_in_sample:
            return artifact
    raise AssertionError("no block of the first 64 fell on the wanted side of a half sample")


def test_a_corrupted_block_in_the_sample_is_no_go(minilm, tmp_path):
    report = run_gate1(minilm / "source", _corrupted(minilm, tmp_path, True), HALF)
    assert report.verdict == "NO-GO"
    assert blocked_tensors(report, "tensor.reproduction_mismatch") == {TENSOR}


def test_a_corrupted_block_outside_the_sample_is_the_declared_risk(minilm, tmp_path):
    artifact = _corrupted(minilm, tmp_path, False)
    sampled = run_gate1(minilm / "source", artifact, HALF)
    assert sampled.verdict == "GO", sampled.blockers
    assert any("caught with probability 0.5" in line for line in sampled.not_verified)
    full = run_gate1(minilm / "source", artifact)
    assert blocked_tensors(full, "tensor.reproduction_mismatch") == {TENSOR}


def test_a_sample_fraction_outside_zero_to_one_is_refused():
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="reproduce_sample"):
            Policy(reproduce_sample=bad)
