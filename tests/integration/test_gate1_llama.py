"""Gate 1 on a llama conversion: llama.cpp's converter permutes Q and K rows (GQA: K with the KV
head count); gate 1 undoes that explicitly and says GO. Without the transform, it must say NO-GO
on exactly the permuted tensors, so the permutation is real and not invented to pass."""

from __future__ import annotations

import pytest

from engine.gates.architectures import llama as architectures
from tests.conftest import blocked_tensors, run_gate1

pytestmark = pytest.mark.slow


@pytest.mark.coverage(arch="llama", types=("F32", "Q8_0", "Q4_K_M"), imatrix=False, proves="GO", gates="1")
@pytest.mark.parametrize("gguf_type", ["F32", "Q8_0", "Q4_K_M"])
def test_llama_conversion_is_go_with_permutation_undone(tiny_llama, gguf_type):
    report = run_gate1(tiny_llama / "source", tiny_llama / f"tiny-llama-{gguf_type}.gguf")
    assert report.verdict == "GO", report.blockers
    rows = {r["gguf_name"]: r for r in report.gates["storage"].details["tensors"]}
    assert rows["blk.0.attn_q.weight"]["transform"] == "llama Q head permutation (n_head=4)"
    assert rows["blk.1.attn_k.weight"]["transform"] == "llama K head permutation (n_head_kv=2)"
    assert rows["blk.0.attn_v.weight"]["transform"] is None


def test_without_the_transform_q_and_k_fail(tiny_llama, monkeypatch):
    monkeypatch.setattr(architectures.Llama, "transform", lambda self, name, rows: None)
    report = run_gate1(tiny_llama / "source", tiny_llama / "tiny-llama-F32.gguf")
    assert report.verdict == "NO-GO"
    expected = {f"blk.{i}.attn_{p}.weight" for i in (0, 1) for p in ("q", "k")}
    assert blocked_tensors(report, "tensor.value_mismatch") == expected
