"""Item 2's bug: an honest Q8_0 that llama-quantize made from an F16 GGUF, checked by the bound alone.

The quantizer saw F16-rounded weights, so the bound must hold against them, not the F32 source.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.formats.source import open_source
from engine.gates.storage.gate import run_storage_gate, validate_structure
from engine.policy import Policy


@pytest.fixture(scope="module")
def q8_0_from_f16(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import llama_cpp

    target = tmp_path_factory.mktemp("f16-q8") / "minilm-Q8_0-from-F16.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
    params.nthread = 1
    assert llama_cpp.llama_model_quantize(str(minilm / "minilm-F16.gguf").encode(), str(target).encode(), params) == 0
    return target


@pytest.mark.coverage(arch="bert", types=("F16", "Q8_0"), imatrix=False, proves="GO", gates="1")
def test_q8_0_from_an_f16_gguf_passes_the_bound_checked_against_f16_input(minilm, q8_0_from_f16):
    layout = validate_structure(q8_0_from_f16)
    assert not isinstance(layout, tuple)
    result, blockers = run_storage_gate(q8_0_from_f16, layout, open_source(minilm / "source"),
                                        Policy(reproduce_quantized=False))
    assert [b.code for b in blockers] == [] and result.status == "passed"
    q8_rows = [row for row in result.details["tensors"] if row["gguf_type"] == "Q8_0"]
    assert q8_rows and "f16" in {row["input_precision"] for row in q8_rows}
    assert all(row["bound_violations"] == 0 for row in q8_rows)
