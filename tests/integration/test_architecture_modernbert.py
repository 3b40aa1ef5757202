"""ModernBERT (GGUF arch `modern-bert`) end to end: honest F16 and Q8_0 conversions made by llama.cpp's own
converter and quantizer get GO through gates 1 and 2 (embedding cosine against sentence-transformers), the
fused `Wqkv` and `Wi` are compared fused, and a twin with one defect gets NO-GO naming the tensor or key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.formats.gguf_structure import read_layout
from engine.report import Report
from tests.conftest import blocked_tensors, codes, defect_copy, run_gates
from tests.gguf_rewrite import rewrite
from tests.integration.test_gates_runtime_release import ENGLISH

pytestmark = pytest.mark.slow
ARCH = "modern-bert"
GATES = {1, 2}


@pytest.fixture(scope="module")
def reports(modernbert: Path) -> dict[str, Report]:
    return {t: run_gates(modernbert / "source", modernbert / f"{t}.gguf", {1, 2, 3}, texts=ENGLISH)
            for t in ("F16", "Q8_0")}


def _rows(report: Report) -> dict[str, dict]:
    return {row["gguf_name"]: row for row in report.gates["storage"].details["tensors"]}


@pytest.mark.coverage(arch=ARCH, types=("F16", "Q8_0"), imatrix=False, proves="GO", gates="1,2,3")
@pytest.mark.parametrize("gguf_type", ["F16", "Q8_0"])
def test_modernbert_honest_conversion_is_go(reports: dict[str, Report], gguf_type: str) -> None:
    report = reports[gguf_type]
    assert report.verdict == "GO", [(b.code, b.tensor or b.key, b.why[:200]) for b in report.blockers]
    assert len(report.gates["storage"].details["tensors"]) == 14
    embeddings = report.gates["runtime"].details["embeddings"]
    assert embeddings["pooling"] == "mean" and embeddings["min_cosine"] > 0.999


def test_modernbert_fused_projections_are_kept_and_compared_fused(reports: dict[str, Report]) -> None:
    rows = _rows(reports["F16"])
    assert rows["blk.1.attn_qkv.weight"]["source_names"] == ["layers.1.attn.Wqkv.weight"]
    assert rows["blk.1.attn_qkv.weight"]["shape"] == [3 * 64, 64]
    assert rows["blk.0.ffn_up.weight"]["source_names"] == ["layers.0.mlp.Wi.weight"]
    assert rows["blk.0.ffn_up.weight"]["shape"] == [2 * 128, 64]
    assert "blk.0.attn_norm.weight" not in rows  # layer 0's attention norm is an identity in both files


def test_modernbert_metadata_comes_from_its_own_config_fields(reports: dict[str, Report]) -> None:
    checked = {c["key"]: c for c in reports["F16"].gates["storage"].details["metadata"]}
    assert checked["modern-bert.rope.freq_base"]["expected"] == 160000.0
    assert checked["modern-bert.rope.freq_base_swa"]["expected"] == 10000.0
    assert checked["modern-bert.attention.sliding_window"]["expected"] == 128
    assert "norm_eps" in checked["modern-bert.attention.layer_norm_epsilon"]["origin"]


@pytest.mark.coverage(arch=ARCH, types=("F16",), imatrix=False, proves="NO-GO", gates="1,2",
                      defect="a q row and a k row of the fused Wqkv swapped")
def test_modernbert_with_q_and_k_rows_swapped_inside_attn_qkv_is_no_go(modernbert: Path, tmp_path: Path) -> None:
    name = "blk.1.attn_qkv.weight"
    n_rows = read_layout(modernbert / "F16.gguf").tensor(name).numpy_shape[0]

    def swap_q_and_k_row(data: np.ndarray) -> None:
        rows = data.reshape(n_rows, -1)
        rows[[3, 64 + 3]] = rows[[64 + 3, 3]]

    twin = defect_copy(modernbert / "F16.gguf", tmp_path, name, swap_q_and_k_row)
    report = run_gates(modernbert / "source", twin, GATES, texts=ENGLISH)
    assert report.verdict == "NO-GO"
    assert blocked_tensors(report, "tensor.value_mismatch") == {name}
    # gate 2 sees it too, as a gap to the source (its correctness reference runs the same swapped rows)
    assert any(code.startswith("quality.") for code in codes(report)), codes(report)


@pytest.mark.coverage(arch=ARCH, types=("F16",), imatrix=False, proves="NO-GO", gates="1,2",
                      defect="global layers' rope base set to the sliding-window one")
def test_modernbert_with_the_local_rope_base_on_global_layers_is_no_go(modernbert: Path, tmp_path: Path) -> None:
    twin = rewrite(modernbert / "F16.gguf", tmp_path / "rope.gguf", set_keys={"modern-bert.rope.freq_base": 10000.0})
    report = run_gates(modernbert / "source", twin, GATES, texts=ENGLISH)
    assert report.verdict == "NO-GO"
    assert {b.key for b in report.blockers if b.code == "metadata.mismatch"} == {"modern-bert.rope.freq_base"}
    assert "embedding.cosine_below_threshold" in codes(report)


@pytest.mark.coverage(arch=ARCH, types=("F16",), imatrix=False, proves="NO-GO", gates="1",
                      defect="sliding-window layers' rope base set to the global one")
def test_modernbert_with_the_global_rope_base_on_local_layers_is_no_go(modernbert: Path, tmp_path: Path) -> None:
    twin = rewrite(modernbert / "F16.gguf", tmp_path / "rope-swa.gguf",
                   set_keys={"modern-bert.rope.freq_base_swa": 160000.0})
    report = run_gates(modernbert / "source", twin, {1})
    assert report.verdict == "NO-GO"
    assert {b.key for b in report.blockers if b.code == "metadata.mismatch"} == {"modern-bert.rope.freq_base_swa"}


@pytest.mark.coverage(arch=ARCH, types=("F16",), imatrix=False, proves="NO-GO", gates="1",
                      defect="LayerNorm epsilon not the config's norm_eps")
def test_modernbert_with_another_layer_norm_epsilon_is_no_go(modernbert: Path, tmp_path: Path) -> None:
    twin = rewrite(modernbert / "F16.gguf", tmp_path / "eps.gguf",
                   set_keys={"modern-bert.attention.layer_norm_epsilon": 1e-6})
    report = run_gates(modernbert / "source", twin, {1})
    assert report.verdict == "NO-GO"
    assert {b.key for b in report.blockers if b.code == "metadata.mismatch"} == {
        "modern-bert.attention.layer_norm_epsilon"}


def test_modernbert_expectations_follow_norm_eps_and_transformers_defaults() -> None:
    """A config with only `norm_eps` (what transformers saves): the epsilon llama.cpp must read is that one,
    and a classifier pools as transformers' default (`cls`) unless the config says otherwise."""
    from engine.gates.architectures import architecture_for

    arch = architecture_for(ARCH, {"architectures": ["ModernBertModel"], "num_hidden_layers": 2, "norm_eps": 1e-6})
    assert arch is not None
    expected = {e.key: e for e in arch.expectations()}
    assert expected["modern-bert.attention.layer_norm_epsilon"].expected == 1e-6
    assert expected["modern-bert.classifier.pooling_type"].expected == 2
    # no rope key in this config: the bases come from the saved config.json's rope_parameters, which
    # transformers 5 always writes (test_config_generations.py reads 4.x and 5.x configs)
    assert "modern-bert.rope.freq_base" not in expected
    assert expected["modern-bert.attention.sliding_window_pattern"].expected == 3
    assert "modern-bert.rope.freq_base_swa" not in expected
