"""Gate 1 on real conversions made by llama.cpp's own tools: GO when honest, NO-GO naming the
tensor for every defect the gate exists to catch."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

from engine.policy import Policy
from tests.conftest import MINILM_TYPES, blocked_tensors, codes, defect_copy, run_gate1
from tests.gguf_rewrite import rewrite

pytestmark = pytest.mark.slow
Q_NAME = "blk.0.attn_q.weight"
Q_SOURCE = "encoder.layer.0.attention.self.query.weight"


@pytest.mark.coverage(arch="bert", types=MINILM_TYPES, imatrix=False, proves="GO", gates="1")
@pytest.mark.parametrize("gguf_type", MINILM_TYPES)
def test_honest_conversion_is_go(minilm, gguf_type):
    report = run_gate1(minilm / "source", minilm / f"minilm-{gguf_type}.gguf")
    assert report.verdict == "GO", report.blockers
    storage = report.gates["storage"].details
    assert len(storage["tensors"]) == 101
    assert storage["inventory"]["embeddings.position_ids"].startswith("omitted")
    assert all(check["result"] == "ok" for check in storage["metadata"])
    kinds = storage["check_kinds"]
    assert kinds["F32"] == {"bit-exact": 64 if gguf_type != "F32" else 101}
    for quant in set(kinds) - {"F32", "F16", "BF16"}:
        assert kinds[quant] == {"reproduced": sum(kinds[quant].values())}
    assert {"gate 2 (runtime) was not requested", "gate 3 (release) was not requested"} <= set(report.not_verified)


def f32_view(raw: np.ndarray) -> np.ndarray:
    return raw.view("<f4")


FLOAT_DEFECTS = {
    "transposed square matrix": (Q_NAME, lambda raw: f32_view(raw).__setitem__(
        slice(None), f32_view(raw).reshape(384, 384).T.copy().reshape(-1))),
    "one weight one ulp off": (Q_NAME, lambda raw: f32_view(raw).__setitem__(
        5, np.nextafter(f32_view(raw)[5], np.float32(np.inf)))),
    "norm scaled by 1.001": ("blk.0.attn_output_norm.weight", lambda raw: f32_view(raw).__setitem__(
        slice(None), f32_view(raw) * np.float32(1.001))),
}


@pytest.mark.coverage(arch="bert", types=("F32",), imatrix=False, proves="NO-GO", gates="1",
                     defect="a transposed square matrix, one weight one ulp off, a norm scaled by 1.001")
@pytest.mark.parametrize("defect", FLOAT_DEFECTS, ids=list(FLOAT_DEFECTS))
def test_float_defect_is_no_go_naming_the_tensor(minilm, tmp_path, defect):
    tensor, mutate = FLOAT_DEFECTS[defect]
    bad = defect_copy(minilm / "minilm-F32.gguf", tmp_path, tensor, mutate)
    report = run_gate1(minilm / "source", bad)
    assert report.verdict == "NO-GO"
    assert blocked_tensors(report, "tensor.value_mismatch") == {tensor}


def test_one_nan_is_not_finite(minilm, tmp_path):
    bad = defect_copy(minilm / "minilm-F16.gguf", tmp_path, Q_NAME,
                      lambda raw: raw.view("<u2").__setitem__(7, 0x7E00))
    report = run_gate1(minilm / "source", bad)
    assert report.verdict == "NO-GO"
    assert blocked_tensors(report, "tensor.not_finite") == {Q_NAME}


@pytest.mark.coverage(arch="bert", types=("F32",), imatrix=False, proves="NO-GO",
                      gates="1", defect="two same-shape tensors swapped")
def test_swapped_same_shape_tensors_are_both_named(minilm, tmp_path):
    src = minilm / "minilm-F32.gguf"
    from engine.formats.gguf_structure import read_layout

    layout = read_layout(src)
    k = layout.tensor("blk.0.attn_k.weight")
    q = layout.tensor(Q_NAME)
    bad = tmp_path / "swapped.gguf"
    data = bytearray(src.read_bytes())
    q_bytes = bytes(data[q.offset:q.offset + q.nbytes])
    data[q.offset:q.offset + q.nbytes] = data[k.offset:k.offset + k.nbytes]
    data[k.offset:k.offset + k.nbytes] = q_bytes
    bad.write_bytes(bytes(data))
    report = run_gate1(minilm / "source", bad)
    assert blocked_tensors(report, "tensor.value_mismatch") == {Q_NAME, "blk.0.attn_k.weight"}


def element_inside_bound_after_plus_one(minilm) -> int:
    """A byte offset in the Q8_0 tensor whose code +1 still meets the Q8_0 error bound (< 0.55 d),
    while its source value is far (> 1e-3 steps) from a rounding tie."""
    from engine.formats.gguf_structure import read_layout

    path = minilm / "minilm-Q8_0.gguf"
    info = read_layout(path).tensor(Q_NAME)
    x = load_file(str(minilm / "source" / "model.safetensors"))[Q_SOURCE].astype(np.float32).reshape(-1, 32)
    blocks = np.fromfile(path, dtype=np.uint8, count=info.nbytes, offset=info.offset).reshape(-1, 34)
    d = blocks[:, :2].copy().view("<f2").astype(np.float64)
    codes = blocks[:, 2:].view(np.int8).astype(np.float64)
    new_error = np.abs(x - d * (codes + 1))
    tie_distance = np.abs(np.abs(x / d - codes) - 0.5)
    ok = (new_error < 0.55 * np.abs(d)) & (tie_distance > 1e-3) & (codes < 127)
    block, j = np.argwhere(ok)[0]
    return int(block * 34 + 2 + j)


@pytest.mark.coverage(arch="bert", types=("Q8_0",), imatrix=False, proves="NO-GO",
                      gates="1", defect="one Q8_0 code moved by one step")
def test_q8_0_code_plus_one_is_caught_only_by_reproduction(minilm, tmp_path):
    at = element_inside_bound_after_plus_one(minilm)
    bad = defect_copy(minilm / "minilm-Q8_0.gguf", tmp_path, Q_NAME,
                      lambda raw: raw.view(np.int8).__setitem__(at, raw.view(np.int8)[at] + 1))
    report = run_gate1(minilm / "source", bad)
    assert report.verdict == "NO-GO"
    assert blocked_tensors(report, "tensor.reproduction_mismatch") == {Q_NAME}
    row = next(r for r in report.gates["storage"].details["tensors"] if r["gguf_name"] == Q_NAME)
    assert row["mismatched"] == 1 and row["ties_forgiven"] == 0
    assert row["bound_violations"] == 0  # the error bound alone cannot see it
    bounded = run_gate1(minilm / "source", bad, Policy(reproduce_quantized=False))
    assert bounded.verdict == "GO"
    assert bounded.gates["storage"].details["check_kinds"]["Q8_0"] == {"bounded": 37}


@pytest.mark.coverage(arch="bert", types=("F32",), imatrix=False, proves="NO-GO", gates="1", defect="a tensor dropped")
def test_dropped_tensor_is_missing(minilm, tmp_path):
    bad = rewrite(minilm / "minilm-F32.gguf", tmp_path / "dropped.gguf", drop=("blk.3.ffn_up.bias",))
    report = run_gate1(minilm / "source", bad)
    assert blocked_tensors(report, "tensor.missing") == {"encoder.layer.3.intermediate.dense.bias"}


def test_extra_tensor_is_unexpected(minilm, tmp_path):
    bad = rewrite(minilm / "minilm-F32.gguf", tmp_path / "extra.gguf", add={"blk.0.extra.weight": np.ones(384)})
    report = run_gate1(minilm / "source", bad)
    assert report.verdict == "NO-GO"
    assert blocked_tensors(report, "tensor.unexpected") == {"blk.0.extra.weight"}


@pytest.mark.parametrize(("key", "value"), [("bert.block_count", 5), ("bert.attention.layer_norm_epsilon", 1e-5)])
def test_metadata_disagreeing_with_config_is_no_go(minilm, tmp_path, key, value):
    bad = rewrite(minilm / "minilm-Q8_0.gguf", tmp_path / "meta.gguf", set_keys={key: value})
    report = run_gate1(minilm / "source", bad)
    assert report.verdict == "NO-GO"
    assert "metadata.mismatch" in codes(report)
    assert any(key in b.why for b in report.blockers)


@pytest.mark.coverage(arch="bert", types=("F32",), imatrix=False, proves="NO-GO",
                      gates="1", defect="a wrong pooling type")
def test_pooling_type_changed_is_pooling_mismatch(minilm, tmp_path):
    bad = rewrite(minilm / "minilm-F16.gguf", tmp_path / "pool.gguf", set_keys={"bert.pooling_type": 2})
    report = run_gate1(minilm / "source", bad)
    assert codes(report) == {"metadata.pooling_mismatch"}


def test_wrong_source_tensor_is_caught_through_the_permuted_reproduction(minilm, tmp_path):
    """Gate 1 must not pass a quantized tensor built from other data (ffn_up of block 1 vs 0)."""
    from engine.formats.gguf_structure import read_layout

    src = minilm / "minilm-Q4_K_M.gguf"
    layout = read_layout(src)
    a, b = layout.tensor("blk.0.ffn_down.weight"), layout.tensor("blk.1.ffn_down.weight")
    assert a.ggml_type.name == b.ggml_type.name == "Q4_K"
    data = bytearray(src.read_bytes())
    data[a.offset:a.offset + a.nbytes] = data[b.offset:b.offset + b.nbytes]
    bad = tmp_path / "copied-block.gguf"
    bad.write_bytes(bytes(data))
    report = run_gate1(minilm / "source", bad)
    assert blocked_tensors(report, "tensor.reproduction_mismatch") == {"blk.0.ffn_down.weight"}


def test_a_type_no_independent_reader_handles_is_a_blocker_not_a_crash(minilm, monkeypatch):
    from engine.errors import UnsupportedTypeError
    from engine.quant import reference

    real = reference.dequantize

    def no_q8_0(raw, ggml_type):
        if ggml_type.name == "Q8_0":
            raise UnsupportedTypeError("gguf-py cannot dequantize Q8_0 (simulated)")
        return real(raw, ggml_type)

    monkeypatch.setattr(reference, "dequantize", no_q8_0)
    report = run_gate1(minilm / "source", minilm / "minilm-Q8_0.gguf")
    assert report.verdict == "NO-GO"
    assert len(blocked_tensors(report, "tensor.type_unsupported")) == 37
