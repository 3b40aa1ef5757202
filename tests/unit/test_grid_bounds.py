"""The per-element bound of the vector-codebook IQ types (engine/quant/grid_bounds.py): every honest libggml
quantization stays within it, whatever the importance matrix and input precision, and planted defects
beyond it are caught; an imatrix IQ tensor checked without its imatrix is no longer `type_unsupported`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.acceptance import accept_unreproduced
from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.formats.source import open_source
from engine.gates.storage.reproduction import round_input
from engine.gates.storage.tensor_values import check_tensor
from engine.policy import Policy
from engine.quant import bounds, reference
from engine.quant.grid_bounds import GRID_RULES
from engine.report import GateResult

GRID_TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
SIGNED = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
COLS = 512


def _rows(rng: np.random.Generator, kind: str, n: int = 4) -> np.ndarray:
    if kind == "gauss":
        x = rng.normal(0, 0.02, (n, COLS))
    elif kind == "laplace":
        x = rng.laplace(0, 0.02, (n, COLS))
    elif kind == "uniform":
        x = rng.uniform(-0.05, 0.05, (n, COLS))
    else:  # outliers: a few columns 30x larger, one tiny row (subnormal fp16 scales), and one 32-value
        # sub-block below every quantizer's GROUP_MAX_EPS (skipped: no signs stored) in a normal block
        x = rng.normal(0, 0.02, (n, COLS))
        x[:, rng.integers(0, COLS, 6)] *= 30
        x[-1] *= 1e-4
        x[0, 32:64] *= 1e-15
        x[1, 256:512] = 0  # an all-zero 256-block: d = 0, every value 0
    return x.astype(np.float32)


def _weights(rng: np.random.Generator, kind: str) -> np.ndarray | None:
    if kind == "none":
        return None
    if kind == "uniform":
        w = np.ones(COLS)
    elif kind == "lognormal":
        w = np.exp(rng.normal(0, 2.5, COLS))
    elif kind == "sparse":  # an imatrix row with zeros (columns never activated)
        w = np.exp(rng.normal(0, 1, COLS)) * (rng.random(COLS) < 0.5)
    else:  # one-hot-like: a few columns carry all the weight
        w = np.zeros(COLS)
        w[rng.integers(0, COLS, 12)] = 1.0
    return w.astype(np.float32)


def _quantize(x: np.ndarray, type_name: str, weights: np.ndarray | None) -> np.ndarray:
    return reference.quantize(x, GGML_TYPES_BY_NAME[type_name], quant_weights=weights)


def _violations(raw: np.ndarray, type_name: str, x: np.ndarray) -> int:
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    bound = bounds.error_bound(raw, ggml_type, x)
    assert bound is not None
    error = np.abs(x.astype(np.float64) - reference.dequantize(raw, ggml_type).reshape(x.shape))
    return int((error > bound * (1 + 1e-6) + 1e-30).sum())


@pytest.mark.parametrize("type_name", GRID_TYPES)
def test_honest_quantizations_stay_within_the_bound(type_name):
    """Many seeds, four row shapes, five importance matrices (and none where optional), three precisions."""
    weight_kinds = ["uniform", "lognormal", "sparse", "onehot"]
    if type_name not in reference.REQUIRES_IMATRIX:
        weight_kinds.append("none")
    checked = 0
    for seed in range(3):
        rng = np.random.default_rng(seed)
        for row_kind in ("gauss", "laplace", "uniform", "outlier"):
            source = _rows(rng, row_kind)
            for weight_kind in weight_kinds:
                weights = _weights(rng, weight_kind)
                for precision in ("f32", "f16", "bf16"):
                    x = round_input(source, precision)
                    assert _violations(_quantize(x, type_name, weights), type_name, x) == 0, (
                        seed, row_kind, weight_kind, precision)
                    checked += 1
    assert checked >= 3 * 4 * 4 * 3


def _over_bound(type_name: str, honest_source: np.ndarray, quantized_from: np.ndarray) -> int:
    weights = np.random.default_rng(11).uniform(0.1, 3.0, quantized_from.shape[1]).astype(np.float32)
    return _violations(_quantize(quantized_from, type_name, weights), type_name, honest_source)


@pytest.mark.parametrize("type_name", SIGNED)
def test_a_transposed_square_matrix_is_caught(type_name):
    """Half the signs disagree: far more than one per group of 8 (IQ1_S/IQ1_M store no signs, so their
    bound, a magnitude cap, does not see a transposition)."""
    x = np.random.default_rng(1).normal(0, 0.02, (256, 256)).astype(np.float32)
    assert _over_bound(type_name, x, x) == 0
    assert _over_bound(type_name, x, np.ascontiguousarray(x.T)) > x.size // 10


@pytest.mark.parametrize("type_name", GRID_TYPES)
def test_a_row_scaled_beyond_the_magnitude_factor_is_caught(type_name):
    x = _rows(np.random.default_rng(2), "gauss")
    scaled = x.copy()
    scaled[1] *= np.float32(GRID_RULES[type_name][0] * 1.5)
    assert _over_bound(type_name, x, x) == 0
    caught = _over_bound(type_name, x, scaled)
    assert caught >= COLS // 256  # the largest values of each 256-block of the row exceed the cap
    raw = _quantize(scaled, type_name, None if type_name not in reference.REQUIRES_IMATRIX else np.ones(COLS, "f4"))
    bound = bounds.error_bound(raw, GGML_TYPES_BY_NAME[type_name], x)
    assert bound is not None and (bound[1] == 0).sum() >= COLS // 256  # the cap itself, not just |x| + cap
    unscaled = x.copy()
    unscaled[1] *= np.float32(GRID_RULES[type_name][0] * 0.5)  # within the cap: only signs could tell
    assert _over_bound(type_name, x, unscaled) == 0


@pytest.mark.parametrize("type_name", GRID_TYPES)
def test_one_weight_moved_by_a_large_step_is_caught(type_name):
    x = _rows(np.random.default_rng(3), "gauss")
    x[0] *= 10  # a larger row elsewhere in the tensor does not widen this row's cap
    moved = x.copy()
    moved[2, 100] = np.float32(3 * GRID_RULES[type_name][0]) * np.abs(x[2, :256]).max()
    assert _over_bound(type_name, x, moved) >= 1


@pytest.mark.parametrize("type_name", SIGNED)
def test_a_row_negated_is_caught_only_where_the_quantizer_cannot_negate_a_sub_block(type_name):
    """IQ2_S/IQ3_S store the sign of x: every element of a negated row disagrees. The parity types have a
    "scale < 0" branch that negates a whole sub-block, so a negated row is within their bound."""
    x = _rows(np.random.default_rng(4), "laplace")
    negated = x.copy()
    negated[0] = -negated[0]
    exact = GRID_RULES[type_name][2] != "parity"
    assert (_over_bound(type_name, x, negated) > COLS * 3 // 4) == exact


@pytest.mark.parametrize("type_name", SIGNED)
def test_signs_flipped_on_large_weights_are_caught(type_name):
    """Exact-sign types: one flipped sign. Parity types may disagree on one element per group of 8, so
    the two largest weights of one group are flipped."""
    x = _rows(np.random.default_rng(5), "gauss")
    flipped = x.copy()
    group = np.abs(x[1, 64:72])
    order = np.argsort(group)[::-1]
    for i in order[: 2 if GRID_RULES[type_name][2] == "parity" else 1]:
        flipped[1, 64 + i] = -flipped[1, 64 + i]
    assert _over_bound(type_name, x, flipped) >= 1


@pytest.mark.parametrize("type_name", ("IQ2_XXS", "IQ2_XS", "IQ3_XXS"))
def test_a_negated_row_with_two_signs_of_one_group_kept_is_caught(type_name):
    """The whole-sub-block negation the parity types allow is itself held to one disagreement per group.
    The group is one with an even count of negatives, so the quantizer flips no sign of its own there and
    exactly the two kept signs disagree with -w."""
    x = _rows(np.random.default_rng(10), "gauss")
    for start in range(0, COLS, 8):
        negated = x.copy()
        negated[0] = -negated[0]
        kept = np.argsort(np.abs(x[0, start:start + 8]))[::-1][:2] + start
        negated[0, kept] = x[0, kept]
        if (negated[0, start:start + 8] < 0).sum() % 2 == 0:
            break
    assert _over_bound(type_name, x, negated) >= 2


def test_iq3_s_signs_after_an_all_zero_sub_block_sit_one_slot_early_and_are_still_checked():
    """libggml's IQ3_S skips an all-zero sub-block without advancing its sign pointer: the honest file's
    later sub-blocks carry their successors' signs. That is within the bound; a flipped sign is not."""
    x = _rows(np.random.default_rng(12), "gauss", n=2)
    x[:, 32:64] = 0
    raw = _quantize(x, "IQ3_S", None)
    w_hat = reference.dequantize(raw, GGML_TYPES_BY_NAME["IQ3_S"]).reshape(x.shape)
    assert ((x[:, 64:256] * w_hat[:, 64:256]) < 0).sum() > 50  # the quantizer's own misplaced signs
    assert _violations(raw, "IQ3_S", x) == 0
    flipped = x.copy()
    flipped[0, 100] = -flipped[0, 100]
    assert _violations(_quantize(flipped, "IQ3_S", None), "IQ3_S", x) == 1
    last_slot_negative = raw.copy()  # the slot no sub-block's signs reached must read positive
    for block in range(last_slot_negative.shape[1] // 110):
        last_slot_negative[:, 110 * block + 74 + 28:110 * block + 74 + 32] = 0xFF
    assert _violations(last_slot_negative, "IQ3_S", x) >= 2 * 32  # one such slot per row


@pytest.mark.parametrize(("type_name", "text"), [
    ("IQ2_S", "|w_hat| <= 5.548*max|x| of its 256-block; sign(w_hat) = sign(w)"),
    ("IQ2_XXS", "|w_hat| <= 5.548*max|x| of its 256-block; sign(w_hat) = sign(w) but for at most one element "
                "per 8 (or all negated per sub-block)"),
    ("IQ1_M", "|w_hat| <= 30.0*max|x| of its 256-block"),
    ("IQ3_S", "|w_hat| <= 16.0*max|x| of its 256-block; sign(w_hat) = sign(w)"),
])
def test_the_report_states_each_rule(type_name, text):
    assert bounds.bound_description(GGML_TYPES_BY_NAME[type_name]) == text
    assert bounds.has_bound(GGML_TYPES_BY_NAME[type_name]) and not bounds.expensive(GGML_TYPES_BY_NAME[type_name])


def _check(tmp_path: Path, x: np.ndarray, type_name: str, stored: bytes, policy: Policy):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "test"}))
    save_file({"w": x}, str(tmp_path / "model.safetensors"))
    info = TensorInfo("blk.0.ffn_gate.weight", (x.shape[1], x.shape[0]), GGML_TYPES_BY_NAME[type_name], 0,
                      len(stored))
    return check_tensor(np.frombuffer(stored, dtype=np.uint8), info, open_source(tmp_path).tensors["w"], None,
                        policy)


RUNTIME_PASSED = {"storage": GateResult(name="storage", status="failed"),
                  "runtime": GateResult(name="runtime", status="passed")}


@pytest.mark.parametrize("type_name", sorted(reference.REQUIRES_IMATRIX))
def test_an_imatrix_quant_checked_without_its_imatrix_is_bounded_not_unsupported(tmp_path, type_name):
    """Without the imatrix: not reproduced, both readers and the bound hold, so the opt-in policy can let
    gate 2 vouch for it; the default policy keeps it NO-GO."""
    x = _rows(np.random.default_rng(6), "gauss", n=8)
    weights = np.random.default_rng(7).uniform(0.05, 4.0, COLS).astype(np.float32)
    stored = _quantize(x, type_name, weights).tobytes()
    opt_in = Policy(without_imatrix="gate2")
    row, blockers = _check(tmp_path, x, type_name, stored, opt_in)
    assert [b.code for b in blockers] == ["tensor.not_reproduced"], blockers
    assert (row.check, row.reader_crosscheck, row.bound_violations) == ("bounded", "agree", 0) and row.bound
    assert accept_unreproduced(blockers, RUNTIME_PASSED, opt_in)[0] == []
    assert accept_unreproduced(blockers, RUNTIME_PASSED, Policy())[0] == blockers


@pytest.mark.parametrize("type_name", sorted(set(GRID_TYPES) - reference.REQUIRES_IMATRIX))
def test_an_optional_imatrix_quant_without_it_is_another_quantizer_within_the_bound(tmp_path, type_name):
    """Types libggml also writes without an imatrix: without it the bytes differ in most blocks of every
    tensor (a systematic difference, reported as not reproduced without the imatrix), and now the bound
    holds on every value as well, so no defect code is raised."""
    from tests.unit.test_reproduction_outcomes import check_file, honest

    weights = np.random.default_rng(5).uniform(0.01, 10.0, 256).astype(np.float32)
    rows, blockers = check_file(tmp_path, honest(type_name, weights), Policy(without_imatrix="gate2"),
                                type_name=type_name)
    assert blockers and {b.code for b in blockers} == {"tensor.not_reproduced"}, blockers
    assert all(row.bound and row.bound_violations == 0 for row in rows), rows


def _defect_mark(type_name: str) -> pytest.MarkDecorator:
    return pytest.mark.coverage(arch="llama (single tensors)", types=(type_name,), imatrix=True, proves="NO-GO",
                                gates="1", defect="another tensor's bytes, caught by the grid bound alone")


@pytest.mark.parametrize("type_name", [pytest.param(t, marks=_defect_mark(t)) for t in GRID_TYPES])
def test_another_tensor_under_the_bound_alone_is_a_value_mismatch(tmp_path, type_name):
    """Another tensor's bytes (rows reversed and negated; for IQ1_S/IQ1_M, which store no signs, also
    scaled beyond their magnitude factor) checked under the bound alone."""
    x = _rows(np.random.default_rng(8), "gauss", n=8)
    weights = np.random.default_rng(9).uniform(0.05, 4.0, COLS).astype(np.float32)
    factor = 2 * GRID_RULES[type_name][0] if type_name not in SIGNED else 1.0
    stored = _quantize(np.ascontiguousarray(-x[::-1] * np.float32(factor)), type_name, weights).tobytes()
    row, blockers = _check(tmp_path, x, type_name, stored, Policy(reproduce_quantized=False))
    assert [b.code for b in blockers] == ["tensor.value_mismatch"]
    assert row.bound_violations is not None and row.bound_violations > 0


@pytest.mark.parametrize("type_name", GRID_TYPES)
def test_the_magnitude_cap_allows_its_rounding_slack_and_nothing_more(monkeypatch, type_name):
    """|w_hat| up to K*max|x| times (1 + RELATIVE_SLACK) is within the bound (fp16 d and float32 fit
    arithmetic); a value clearly past it is not. Signs agree, so only the cap decides."""
    from engine.quant import grid_bounds as module

    factor = GRID_RULES[type_name][0]
    x = np.full((1, module.SUPER_BLOCK), 0.5)
    x[0, 0] = 1.0
    for scale, broken in ((1 + module.RELATIVE_SLACK / 2, False), (1 + 4 * module.RELATIVE_SLACK, True)):
        w_hat = x.copy()
        w_hat[0, 1] = factor * scale
        monkeypatch.setattr(module.reference, "dequantize", lambda raw, ggml_type, w=w_hat: w)
        (bound,) = module.grid_bounds(np.zeros(1, np.uint8), GGML_TYPES_BY_NAME[type_name], [x])
        assert bool(bound[0, 1] == 0.0) is broken, (type_name, scale)
        assert (bound[0, 2:] > 0).all()


def test_a_zero_source_value_never_disagrees_in_sign():
    """The rule's stated choice: x = 0 (or -0.0 from fp16 rounding) agrees with either sign of w_hat."""
    from engine.quant.grid_bounds import _wrong_signs

    x = np.array([[0.0, -0.0, 0.1, -0.1, 0.2, 0.2, 0.2, 0.2]])
    w_hat = np.array([[-0.1, 0.1, 0.1, -0.1, 0.2, 0.2, 0.2, 0.2]])
    assert not _wrong_signs(x, w_hat, 0).any()
    w_hat[0, 2] = -0.1  # a real disagreement is still one
    assert _wrong_signs(x, w_hat, 0)[0, 2]
