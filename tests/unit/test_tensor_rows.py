"""The report row check_tensor writes, field by field, where the field depends on the kind of check: a float
tensor has no quantized fields, a sampled K-quant says how many blocks it compared out of how many, an
importance-weighted one names the reproducer that takes the weights. An auditor reads these rows to know
what was proven of each tensor."""

from __future__ import annotations

import numpy as np
import pytest

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.gates.storage.tensor_values import check_tensor
from engine.policy import Policy
from engine.quant import reference
from engine.quant.sampling import block_sample
from tests.unit.reproduction_inputs import q8_chunk
from tests.unit.test_tensor_check import COLS, ROWS, run, weights

SEED = "0123456789abcdef" * 4
NAME = "blk.0.w"  # the tensor test_tensor_check.run checks
BLOCKS = ROWS * COLS // 256  # super-blocks of a K-quant


def test_a_float_tensor_has_none_of_the_quantized_fields(tmp_path):
    x = weights()
    row, blockers = run(tmp_path, x, "F16", x.astype(np.float16).tobytes(), sample_seed=SEED)
    assert blockers == []
    quantized_fields = (row.reproducer, row.input_precision, row.bound, row.bound_violations, row.reader_crosscheck,
                        row.blocks, row.sampled_from, row.not_reproduced)
    assert quantized_fields == (None,) * 8
    assert (row.check, row.ties_forgiven, row.result) == ("bit-exact", 0, "ok")


def test_a_sampled_k_quant_counts_the_blocks_it_compared_and_all_it_holds(tmp_path):
    x = weights(1)
    stored = reference.quantize(x, GGML_TYPES_BY_NAME["Q4_K"]).tobytes()
    half = Policy(reproduce_sample=0.5)
    chosen = int(block_sample(SEED, NAME, BLOCKS, 0.5).sum())
    assert 0 < chosen < BLOCKS  # the seed draws a real sample of this tensor
    row, blockers = run(tmp_path, x, "Q4_K", stored, policy=half, sample_seed=SEED)
    assert blockers == [] and row.check == "reproduced"
    assert (row.blocks, row.sampled_from) == (chosen, BLOCKS)
    assert type(row.blocks) is int and type(row.sampled_from) is int  # counts, as the report's schema has them
    assert row.reproducer == reference.reproducer_name(GGML_TYPES_BY_NAME["Q4_K"]) and row.bound is not None


def test_no_sample_without_a_seed_a_whole_policy_or_a_reproduction(tmp_path):
    x = weights(1)
    stored = reference.quantize(x, GGML_TYPES_BY_NAME["Q4_K"]).tobytes()
    for policy, seed in ((Policy(reproduce_sample=0.5), None), (Policy(), SEED),
                         (Policy(reproduce_sample=0.5, reproduce_quantized=False), SEED)):
        row, _ = run(tmp_path, x, "Q4_K", stored, policy=policy, sample_seed=seed)
        assert (row.blocks, row.sampled_from) == (BLOCKS, None), policy


def test_an_importance_weighted_tensor_names_the_reproducer_that_takes_the_weights(tmp_path):
    x = weights(2)
    imatrix = np.linspace(0.5, 2.0, COLS, dtype=np.float32)
    q4_k = GGML_TYPES_BY_NAME["Q4_K"]
    stored = reference.quantize(x, q4_k, quant_weights=imatrix).tobytes()
    row, blockers = run(tmp_path, x, "Q4_K", stored, quant_weights=imatrix)
    assert blockers == [] and row.check == "reproduced"
    assert row.reproducer == reference.reproducer_name(q4_k, True) == "libggml"
    q8_0 = GGML_TYPES_BY_NAME["Q8_0"]
    assert reference.reproducer_name(q8_0, True) != reference.reproducer_name(q8_0, False)
    weighted_q8, _ = run(tmp_path, x, "Q8_0", reference.quantize(x, q8_0, quant_weights=imatrix).tobytes(),
                         quant_weights=imatrix)
    assert weighted_q8.reproducer == "libggml"
    float_row, _ = run(tmp_path, x, "F16", x.astype(np.float16).tobytes(), quant_weights=imatrix)
    assert float_row.reproducer is None  # weights are for quantizers: a float tensor is compared as it is


def test_a_bounded_row_names_its_bound_and_no_reproducer(tmp_path):
    x = weights()
    q8_0 = GGML_TYPES_BY_NAME["Q8_0"]
    row, blockers = run(tmp_path, x, "Q8_0", reference.quantize(x, q8_0).tobytes(),
                        policy=Policy(reproduce_quantized=False))
    assert blockers == [] and row.check == "bounded"
    assert row.reproducer is None and row.bound is not None and row.bound_violations == 0


def test_the_block_counts_add_up_across_chunks_as_integers(tmp_path, monkeypatch):
    from engine.gates.storage import tensor_values

    monkeypatch.setattr(tensor_values, "CHUNK_ELEMENTS", COLS)  # one row per chunk
    x = weights()
    q8_0 = reference.quantize(x, GGML_TYPES_BY_NAME["Q8_0"]).tobytes()
    row, _ = run(tmp_path, x, "Q8_0", q8_0)
    assert row.blocks == ROWS * COLS // 32 and type(row.blocks) is int
    bounded, _ = run(tmp_path, x, "Q8_0", q8_0, policy=Policy(reproduce_quantized=False))
    assert bounded.blocks == ROWS * COLS // 32 and type(bounded.blocks) is int
    q4_k = reference.quantize(x, GGML_TYPES_BY_NAME["Q4_K"]).tobytes()
    sampled, _ = run(tmp_path, x, "Q4_K", q4_k, policy=Policy(reproduce_sample=0.5), sample_seed=SEED)
    assert (sampled.blocks, sampled.sampled_from) == (int(block_sample(SEED, NAME, BLOCKS, 0.5).sum()), BLOCKS)
    assert type(sampled.sampled_from) is int


def test_a_forgiven_rounding_tie_is_counted_in_the_row(tmp_path):
    rows, raw = q8_chunk(3, tie=True)
    row, blockers = run(tmp_path, rows, "Q8_0", raw.tobytes())
    assert blockers == [] and (row.ties_forgiven, row.mismatched) == (1, 0)


def test_a_type_no_check_exists_for_is_refused_by_name(tmp_path):
    from engine.errors import UnsupportedTypeError

    i32 = GGML_TYPES_BY_NAME["I32"]
    info = TensorInfo(NAME, (4,), i32, 0, 16)
    with pytest.raises(UnsupportedTypeError) as refused:
        check_tensor(np.zeros(16, np.uint8), info, None, None, Policy())  # type: ignore[arg-type]
    assert str(refused.value) == f"{NAME} is stored as I32; no check exists for that type"
