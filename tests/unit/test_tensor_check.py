"""check_tensor on small synthetic tensors: each defect it exists to catch, and the report row it writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.formats.source import open_source
from engine.gates.architectures import RowTransform
from engine.gates.storage.tensor_values import check_kind, check_tensor, f32_to_bf16_bits
from engine.policy import Policy
from engine.quant import libggml, reference

ROWS, COLS = 8, 256


def weights(seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((ROWS, COLS)) * 0.1).astype(np.float32)


def run(tmp_path: Path, source_values: np.ndarray, type_name: str, stored: bytes,
        transform: RowTransform | None = None, policy: Policy | None = None, *,
        quant_weights: np.ndarray | None = None, sample_seed: str | None = None):
    """check_tensor of `stored` as tensor blk.0.w, of the source's [rows, cols] shape, 16 bytes into the file."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "test"}))
    save_file({"w": source_values}, str(tmp_path / "model.safetensors"))
    source = open_source(tmp_path)
    ggml = GGML_TYPES_BY_NAME[type_name]
    pad = 16
    file_bytes = np.frombuffer(bytes(pad) + stored, dtype=np.uint8)
    rows, cols = source_values.shape
    info = TensorInfo("blk.0.w", (cols, rows), ggml, pad, len(stored))
    return check_tensor(file_bytes, info, source.tensors["w"], transform, policy or Policy(),
                        quant_weights=quant_weights, sample_seed=sample_seed)


def codes(blockers) -> list[str]:
    return sorted(b.code for b in blockers)


def test_an_identical_f32_tensor_is_bit_exact(tmp_path):
    x = weights()
    row, blockers = run(tmp_path, x, "F32", x.tobytes())
    assert blockers == [] and row.result == "ok"
    assert (row.check, row.mismatched, row.max_abs, row.rel_l2, row.not_finite) == ("bit-exact", 0, 0.0, 0.0, 0)
    assert row.shape == [ROWS, COLS] and row.gguf_type == "F32" and row.source_dtype == "F32"
    assert row.source_names == ["w"] and row.gguf_name == "blk.0.w" and row.transform is None
    assert row.reader_crosscheck is None and row.bound is None and row.reproducer is None


def test_one_ulp_is_a_value_mismatch(tmp_path):
    x = weights()
    stored = x.copy()
    stored.view(np.uint32)[3, 7] ^= 1
    row, blockers = run(tmp_path, x, "F32", stored.tobytes())
    assert codes(blockers) == ["tensor.value_mismatch"] and blockers[0].tensor == "blk.0.w"
    assert row.mismatched == 1 and 0 < row.max_abs < 1e-7 and row.rel_l2 > 0 and row.result == "fail"
    assert "1 values differ bitwise" in blockers[0].why


def test_signed_zero_and_nan_are_bits_not_values(tmp_path):
    x = weights()
    x[0, 0] = 0.0
    stored = x.copy()
    stored[0, 0] = -0.0
    stored[1, 1] = np.nan
    row, blockers = run(tmp_path, x, "F32", stored.tobytes())
    assert row.signed_zero_flips == 1 and row.not_finite == 1 and row.mismatched == 2
    assert codes(blockers) == ["tensor.not_finite", "tensor.value_mismatch"]
    assert "1 stored values are NaN/inf" in next(b.why for b in blockers if b.code == "tensor.not_finite")


def test_half_types_must_be_our_own_cast(tmp_path):
    x = weights()
    row, blockers = run(tmp_path, x, "F16", x.astype(np.float16).tobytes())
    assert blockers == [] and row.check == "bit-exact"
    off = x.astype(np.float16)
    off.view(np.uint16)[2, 2] ^= 1
    assert codes(run(tmp_path, x, "F16", off.tobytes())[1]) == ["tensor.value_mismatch"]
    bf16 = f32_to_bf16_bits(x)
    assert run(tmp_path, x, "BF16", bf16.tobytes())[1] == []
    truncated = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation, not round-to-nearest-even
    assert codes(run(tmp_path, x, "BF16", truncated.tobytes())[1]) == ["tensor.value_mismatch"]


def test_a_row_transform_is_applied_and_required(tmp_path):
    x = weights()
    order = np.array([1, 0, 3, 2, 5, 4, 7, 6])
    stored = x[order]
    transform = RowTransform("swap pairs", order)
    row, blockers = run(tmp_path, x, "F32", stored.tobytes(), transform)
    assert blockers == [] and row.transform == "swap pairs"
    assert codes(run(tmp_path, x, "F32", stored.tobytes())[1]) == ["tensor.value_mismatch"]


def test_q8_0_is_reproduced_byte_for_byte(tmp_path):
    x = weights()
    stored = reference.quantize(x, GGML_TYPES_BY_NAME["Q8_0"]).tobytes()
    row, blockers = run(tmp_path, x, "Q8_0", stored)
    assert blockers == [] and row.check == "reproduced" and row.reproducer is not None
    assert row.input_precision == "f32" and row.bound is not None and row.bound_violations == 0
    assert row.reader_crosscheck in ("agree", None) and row.max_abs > 0


def test_q8_0_from_a_half_precision_pipeline_is_recognised(tmp_path):
    x = weights()
    stored = reference.quantize(x.astype(np.float16).astype(np.float32), GGML_TYPES_BY_NAME["Q8_0"]).tobytes()
    row, blockers = run(tmp_path, x, "Q8_0", stored)
    assert blockers == [] and row.input_precision == "f16"


def test_one_q8_0_code_is_caught_by_reproduction_not_by_the_bound(tmp_path):
    x = weights()
    raw = bytearray(reference.quantize(x, GGML_TYPES_BY_NAME["Q8_0"]).tobytes())
    blocks = np.frombuffer(bytes(raw), dtype=np.uint8).reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n_blocks, 1)
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    residual = x.reshape(-1, 32) / d - q
    block, element = np.unravel_index(np.argmax(np.abs(residual)), residual.shape)
    # one step towards the source value: the nearest code that is not the reference's choice
    raw[34 * block + 2 + element] = (raw[34 * block + 2 + element] + (1 if residual[block, element] > 0 else -1)) % 256
    row, blockers = run(tmp_path, x, "Q8_0", bytes(raw))
    assert codes(blockers) == ["tensor.reproduction_mismatch"] and row.mismatched == 1
    assert "1 of 64 Q8_0 blocks differ" in blockers[0].why
    bounded_row, bounded = run(tmp_path, x, "Q8_0", bytes(raw), policy=Policy(reproduce_quantized=False))
    assert bounded_row.check == "bounded" and bounded == []


def test_a_scale_blown_up_breaks_the_bound(tmp_path):
    x = weights()
    raw = bytearray(reference.quantize(x, GGML_TYPES_BY_NAME["Q8_0"]).tobytes())
    raw[34 * 2 + 1] ^= 0x20  # the fp16 scale's exponent
    row, blockers = run(tmp_path, x, "Q8_0", bytes(raw), policy=Policy(reproduce_quantized=False))
    assert codes(blockers) == ["tensor.value_mismatch"] and row.bound_violations > 0
    assert "exceed the Q8_0 bound" in blockers[0].why


def test_a_k_quant_is_reproduced_by_libggml(tmp_path):
    x = weights(1)
    stored = reference.quantize(x, GGML_TYPES_BY_NAME["Q4_K"]).tobytes()
    row, blockers = run(tmp_path, x, "Q4_K", stored)
    assert blockers == [] and row.check == "reproduced" and row.reader_crosscheck == "agree"


def test_check_kinds():
    policy, bounded = Policy(), Policy(reproduce_quantized=False)
    info = TensorInfo("t", (32,), GGML_TYPES_BY_NAME["Q8_0"], 0, 34)
    assert (check_kind(info, policy), check_kind(info, bounded)) == ("reproduced", "bounded")
    assert check_kind(TensorInfo("t", (32,), GGML_TYPES_BY_NAME["F16"], 0, 64), bounded) == "bit-exact"


def test_statistics_add_up_across_chunks(tmp_path, monkeypatch):
    """One row per chunk: defects in different chunks are counted together, never overwritten."""
    from engine.gates.storage import tensor_values

    monkeypatch.setattr(tensor_values, "CHUNK_ELEMENTS", COLS)
    x = weights()
    x[0, 0] = x[5, 0] = 0.0
    stored = x.copy()
    stored.view(np.uint32)[1, 3] ^= 1
    stored.view(np.uint32)[6, 9] ^= 1
    stored[0, 0] = stored[5, 0] = -0.0
    stored[2, 2] = stored[7, 7] = np.inf
    row, blockers = run(tmp_path, x, "F32", stored.tobytes())
    assert codes(blockers) == ["tensor.not_finite", "tensor.value_mismatch"]
    assert (row.mismatched, row.not_finite, row.signed_zero_flips) == (6, 2, 2)
    finite = np.isfinite(stored)
    diff = (x[finite].astype(np.float64) - stored[finite].astype(np.float64))
    assert row.rel_l2 == pytest.approx(np.sqrt((diff ** 2).sum() / (x[finite].astype(np.float64) ** 2).sum()))
    assert row.max_abs == pytest.approx(np.abs(diff).max())
    half = x.astype(np.float16)
    half.view(np.uint16)[1, 1] ^= 1
    half.view(np.uint16)[6, 1] ^= 1
    assert run(tmp_path, x, "F16", half.tobytes())[0].mismatched == 2
    bf16 = f32_to_bf16_bits(x)
    bf16[1, 1] ^= 1
    bf16[6, 1] ^= 1
    assert run(tmp_path, x, "BF16", bf16.tobytes())[0].mismatched == 2


def test_half_precision_statistics_are_of_the_decoded_values(tmp_path):
    x = weights()
    bf16 = f32_to_bf16_bits(x)
    decoded = (bf16.astype(np.uint32) << 16).view(np.float32)
    row, _ = run(tmp_path, x, "BF16", bf16.tobytes())
    assert row.max_abs == pytest.approx(float(np.abs(x.astype(np.float64) - decoded).max()), rel=1e-12)
    half = x.astype(np.float16)
    row, _ = run(tmp_path, x, "F16", half.tobytes())
    assert row.max_abs == pytest.approx(float(np.abs(x.astype(np.float64) - half.astype(np.float64)).max()),
                                        rel=1e-12)


def test_q8_0_from_a_bf16_pipeline_is_recognised(tmp_path):
    x = weights()
    rounded = (f32_to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)
    stored = reference.quantize(rounded, GGML_TYPES_BY_NAME["Q8_0"]).tobytes()
    row, blockers = run(tmp_path, x, "Q8_0", stored)
    assert blockers == [] and row.input_precision == "bf16"


def test_bound_violations_add_up_across_chunks(tmp_path, monkeypatch):
    from engine.gates.storage import tensor_values

    monkeypatch.setattr(tensor_values, "CHUNK_ELEMENTS", COLS)
    x = weights()
    raw = bytearray(reference.quantize(x, GGML_TYPES_BY_NAME["Q8_0"]).tobytes())
    per_row = COLS // 32 * 34
    for block in (1, 5 * (COLS // 32) + 1):  # a block in row 0 and one in row 5
        raw[34 * block + 2 + 4] ^= 0x40  # a code far off: one value out of bounds each
    row, blockers = run(tmp_path, x, "Q8_0", bytes(raw), policy=Policy(reproduce_quantized=False))
    assert row.bound_violations == 2 and per_row == 272
    assert codes(blockers) == ["tensor.value_mismatch"]


def test_a_reader_disagreement_is_a_verifier_blocker(tmp_path, monkeypatch):
    x = weights()
    stored = reference.quantize(x, GGML_TYPES_BY_NAME["Q8_0"]).tobytes()
    real = libggml.dequantize
    monkeypatch.setattr(libggml, "dequantize", lambda raw, type_id, n: real(raw, type_id, n) + np.float32(1e-3))
    row, blockers = run(tmp_path, x, "Q8_0", stored)
    assert row.reader_crosscheck == "disagree" and row.result == "fail"
    assert [b.code for b in blockers] == ["verifier.reader_disagreement"]
    assert "gguf-py and libggml dequantize blk.0.w differently" in blockers[0].why


def test_a_type_without_reproducer_or_bound_is_unsupported():
    from engine.gates.storage.tensor_values import _Accumulator, _judge

    info = TensorInfo("t", (256,), GGML_TYPES_BY_NAME["Q8_K"], 0, 292)  # IQ2_S had none before grid_bounds
    (blocker,) = _judge(_Accumulator(), info, "bounded", None, None)
    assert (blocker.code, blocker.tensor) == ("tensor.type_unsupported", "t")
    assert blocker.why == "no reproducer or derived bound for Q8_K"


def test_sampled_rows_are_fixed_per_tensor_and_include_both_ends():
    from engine.gates.storage.tensor_values import _sample_rows

    assert _sample_rows("blk.0.w", 100, 6).tolist() == SAMPLED_BLK0
    assert _sample_rows("other", 100, 6).tolist() == SAMPLED_OTHER
    assert _sample_rows("x", 1, 4).tolist() == [0]


SAMPLED_BLK0 = [0, 10, 13, 67, 91, 99]
SAMPLED_OTHER = [0, 2, 47, 71, 93, 99]
