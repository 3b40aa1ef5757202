"""Item 4: every type llama.cpp's quantizer writes is read by two readers, bounded and reproduced.

Honest tensors are rows of a real fixture tensor (tiny-llama's layer-0 gate_proj, rows of 256)
quantized by libggml, with random positive importance weights where the type needs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.formats.source import open_source
from engine.gates.storage.tensor_values import check_tensor
from engine.policy import Policy
from engine.quant import bounds, reference

NEW_TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
             "TQ1_0", "TQ2_0", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
ROWS = 8


@pytest.fixture(scope="module")
def real_rows(tiny_llama: Path) -> np.ndarray:
    tensors = load_file(str(next((tiny_llama / "source").glob("*.safetensors"))))
    return np.ascontiguousarray(tensors["model.layers.0.mlp.gate_proj.weight"][:ROWS])


def _weights(type_name: str) -> np.ndarray | None:
    if type_name not in reference.REQUIRES_IMATRIX:
        return None
    return np.random.default_rng(7).uniform(0.05, 4.0, 256).astype(np.float32)


def _check(tmp_path: Path, x: np.ndarray, type_name: str, stored: bytes, weights: np.ndarray | None,
           policy: Policy | None = None):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "test"}))
    save_file({"w": x}, str(tmp_path / "model.safetensors"))
    info = TensorInfo("blk.0.ffn_gate.weight", (x.shape[1], x.shape[0]), GGML_TYPES_BY_NAME[type_name], 0,
                      len(stored))
    file_bytes = np.frombuffer(stored, dtype=np.uint8)
    return check_tensor(file_bytes, info, open_source(tmp_path).tensors["w"], None, policy or Policy(),
                        quant_weights=weights)


def _marks(type_name: str, proves: str, defect: str = "") -> pytest.MarkDecorator:
    imatrix = type_name in reference.REQUIRES_IMATRIX
    return pytest.mark.coverage(arch="llama (single tensors)", types=(type_name,), imatrix=imatrix, proves=proves,
                                gates="1", **({"defect": defect} if defect else {}))


@pytest.mark.parametrize("type_name", [pytest.param(t, marks=_marks(t, "GO")) for t in NEW_TYPES])
def test_honest_tensor_passes_readers_bound_and_reproduction(tmp_path, real_rows, type_name):
    weights = _weights(type_name)
    stored = reference.quantize(real_rows, GGML_TYPES_BY_NAME[type_name], quant_weights=weights).tobytes()
    row, blockers = _check(tmp_path, real_rows, type_name, stored, weights)
    assert blockers == [] and row.result == "ok"
    assert (row.check, row.reader_crosscheck, row.mismatched) == ("reproduced", "agree", 0)
    assert row.reproducer == "libggml" and row.blocks == ROWS * 256 // GGML_TYPES_BY_NAME[type_name].block_size
    if bounds.has_bound(GGML_TYPES_BY_NAME[type_name]):
        assert row.bound_violations == 0 and row.bound


@pytest.mark.parametrize("type_name", [pytest.param(t, marks=_marks(t, "NO-GO", "one code changed"))
                                       for t in NEW_TYPES])
def test_one_changed_code_is_caught_by_reproduction(tmp_path, real_rows, type_name):
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    weights = _weights(type_name)
    stored = bytearray(reference.quantize(real_rows, ggml_type, quant_weights=weights).tobytes())
    stored[ggml_type.type_size * 3 + ggml_type.type_size - 1] ^= 0x01  # last byte of block 3: codes
    row, blockers = _check(tmp_path, real_rows, type_name, bytes(stored), weights)
    assert "tensor.reproduction_mismatch" in [b.code for b in blockers]
    assert row.mismatched == 1 and row.result == "fail"


@pytest.mark.parametrize("type_name", sorted(bounds.NEAREST_CODE))
def test_a_grossly_wrong_tensor_violates_the_bound(tmp_path, real_rows, type_name):
    """Another tensor's bytes (the rows reversed) under the bound alone: most values exceed it."""
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    stored = reference.quantize(real_rows[::-1].copy(), ggml_type).tobytes()
    row, blockers = _check(tmp_path, real_rows, type_name, stored, None, Policy(reproduce_quantized=False))
    assert [b.code for b in blockers] == ["tensor.value_mismatch"]
    assert row.bound_violations is not None and row.bound_violations > real_rows.size // 8


@pytest.mark.parametrize("type_name", sorted(bounds.NEAREST_CODE))
def test_bound_holds_on_honest_tensors_and_is_tight(real_rows, type_name):
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    for weights in (None, np.random.default_rng(3).uniform(0.05, 4.0, 256).astype(np.float32)):
        raw = reference.quantize(real_rows, ggml_type, quant_weights=weights)
        error = np.abs(real_rows.astype(np.float64) - reference.dequantize(raw, ggml_type))
        bound = bounds.error_bound(raw, ggml_type, real_rows)
        assert bound is not None and np.all(error <= bound)
        assert (error / bound).max() > 0.9  # the bound is reached: it says something


def test_types_needing_an_imatrix_are_not_reproduced_without_one_and_say_why(tmp_path, real_rows):
    weights = _weights("IQ2_XXS")
    stored = reference.quantize(real_rows, GGML_TYPES_BY_NAME["IQ2_XXS"], quant_weights=weights).tobytes()
    row, blockers = _check(tmp_path, real_rows, "IQ2_XXS", stored, None)
    assert [b.code for b in blockers] == ["tensor.not_reproduced"]  # the default policy keeps it NO-GO
    assert row.check == "bounded" and row.not_reproduced and "--imatrix" in row.not_reproduced
    assert row.bound and row.bound_violations == 0  # the grid bound (grid_bounds) checked every value


def test_requires_imatrix_table_matches_libggml():
    from engine.quant import libggml

    needing = {name for name, t in GGML_TYPES_BY_NAME.items()
               if name in reference.REPRODUCIBLE and libggml.requires_imatrix(t.id)}
    assert needing == reference.REQUIRES_IMATRIX


@pytest.mark.parametrize("type_name", ["IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0"])
def test_the_bound_holds_when_the_fp16_scale_is_subnormal(real_rows, type_name):
    """Weights ~1e-3 (and IQ4_XS's super-scale max_scale/32 at ordinary weights) give fp16 scales below
    2^-14, whose rounding is absolute, not relative; an honest imatrix IQ4_XS file once broke the bound."""
    small = np.ascontiguousarray(real_rows * np.float32(0.0005 if type_name.startswith("TQ") else 0.05))
    weights = np.random.default_rng(3).uniform(0.05, 4.0, 256).astype(np.float32)
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    stored = reference.quantize(small, ggml_type, quant_weights=weights)
    d = stored.reshape(-1, ggml_type.type_size)
    scale = d[:, -2:] if type_name.startswith("TQ") else d[:, :2]
    assert (np.abs(scale.copy().view("<f2").astype(np.float32)) < 2.0**-14).mean() > 0.5
    bound = bounds.error_bound(stored, ggml_type, small)
    err = np.abs(small.astype(np.float64) - reference.dequantize(stored, ggml_type))
    assert (err <= bound * (1 + 1e-6)).all(), f"{int((err > bound).sum())} values over the bound"
