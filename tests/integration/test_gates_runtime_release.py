"""Gates 2 and 3 end to end on real conversions: GO when honest, NO-GO with the right code when
the conversion (or the verifier's input) has the defect each check exists to catch."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.policy import Policy
from engine.texts import DEFAULT_TEXTS
from tests.conftest import SUITE_POLICY, codes, run_gates
from tests.gguf_rewrite import rewrite

pytestmark = pytest.mark.slow
ENGLISH = (
    "The quick brown fox jumps over the lazy dog.",
    "How do I verify that a converted model matches the original weights?",
    "Platform teams gate every quantized model before it ships.",
    "a",
)


def runtime(report) -> dict:
    return report.gates["runtime"].details


@pytest.mark.coverage(arch="bert", types=("F32", "F16", "Q8_0"), imatrix=False, proves="GO", gates="1,2,3")
@pytest.mark.parametrize("gguf_type", ["F32", "F16", "Q8_0"])
def test_minilm_all_gates_go_on_english(minilm, gguf_type):
    report = run_gates(minilm / "source", minilm / f"minilm-{gguf_type}.gguf", {1, 2, 3}, texts=ENGLISH)
    assert report.verdict == "GO", report.blockers
    embeddings = runtime(report)["embeddings"]
    assert embeddings["min_cosine"] > (0.9999 if gguf_type != "Q8_0" else 0.999)
    assert embeddings["retrieval"]["agreement"] == 1.0
    assert report.gates["release"].details["top1"] == embeddings["retrieval"]["candidate_top1"]
    assert {"input kind: non-NFC input (every text was NFC)"} <= set(report.not_verified)


def test_minilm_q4_0_is_correct_for_its_own_weights_and_refused_for_its_cost(minilm):
    """Against transformers on its own (dequantized) weights, Q4_0 differs by llama.cpp's arithmetic alone;
    against the source it costs cosine ~0.96, below the embedding floor. Held to float32 arithmetic's
    thresholds, the 8-bit activations llama.cpp multiplies Q4_0 weights with are NO-GO on correctness."""
    report = run_gates(minilm / "source", minilm / "minilm-Q4_0.gguf", {2}, texts=ENGLISH)
    details = runtime(report)
    assert details["embeddings"]["min_cosine"] > 0.99 > details["quality"]["slices"]["overall"]["min_cosine"] > 0.9
    assert codes(report) == {"quality.cosine_below_budget"}, report.blockers
    float_arithmetic = Policy().runtime["f32"]
    held_to_f32 = {**Policy().runtime, **dict.fromkeys(details["compute_classes"], float_arithmetic)}
    strict = SUITE_POLICY.model_copy(update={"runtime": held_to_f32})
    held = run_gates(minilm / "source", minilm / "minilm-Q4_0.gguf", {2}, strict, texts=ENGLISH)
    assert "embedding.cosine_below_threshold" in codes(held)


def test_minilm_default_korean_divergence_is_reported_and_a_submitted_one_blocks(minilm):
    """BERT's normaliser decomposes Hangul and llama.cpp's WordPiece does not, and no GGUF key governs it: on
    our default Korean text that is reported as llama.cpp's support for the family; a pipeline that sends
    Korean gets its NO-GO."""
    report = run_gates(minilm / "source", minilm / "minilm-F16.gguf", {2})
    assert report.verdict == "GO", report.blockers
    assert "korean" in runtime(report)["tokenizer"]["probe_divergences"]
    assert any("korean" in line for line in runtime(report)["not_covered"])
    assert "near-context-limit" in runtime(report)["texts"]
    korean = next(t.text for t in DEFAULT_TEXTS if t.label == "korean")
    submitted = run_gates(minilm / "source", minilm / "minilm-F16.gguf", {2}, texts=(korean,))
    assert {b.text for b in submitted.blockers if b.code == "tokenizer.ids_mismatch"} == {korean}
    tokenizer = runtime(submitted)["tokenizer"]
    assert tokenizer["mismatches"][0]["hf_ids"] != tokenizer["mismatches"][0]["llama_ids"]


def test_llama_cpp_add_bos_false_also_drops_the_automatic_eos(minilm):
    from engine.runtime.llama_candidate import LlamaCandidate

    candidate = LlamaCandidate(minilm / "minilm-F32.gguf", embedding=True, n_ctx=64)
    try:
        with_special = candidate.tokenize("hello", add_special=True, parse_special=False)
        without = candidate.tokenize("hello", add_special=False, parse_special=False)
    finally:
        candidate.close()
    assert with_special == [101, *without, 102]  # [CLS] ... [SEP]
    assert 101 not in without and 102 not in without


def test_the_candidate_reads_its_weights_from_the_map_without_a_repacked_copy(minilm):
    """llama.cpp's CPU backend copies Q4_0/Q4_K/IQ4_NL weights into repacked anonymous buffers unless
    `use_extra_bufts` is off: a second, unreclaimable copy of a 4-bit model (measured at 1.7B Q4_K_M:
    +650 MiB of anonymous memory), which would break gate 2's memory bound on a 70B file."""
    from engine.runtime.llama_candidate import LlamaCandidate

    candidate = LlamaCandidate(minilm / "minilm-Q4_0.gguf", embedding=True, n_ctx=64)
    try:
        assert candidate.llm.model_params.use_extra_bufts is False
        assert candidate.embed("hello").shape == (384,)
    finally:
        candidate.close()
    import llama_cpp

    assert llama_cpp.llama_model_default_params().use_extra_bufts is True  # the library's default, restored


@pytest.mark.coverage(arch="qwen3", types=("F32", "F16", "Q8_0"), imatrix=False, proves="GO", gates="1,2,3")
@pytest.mark.parametrize("gguf_type", ["F32", "F16", "Q8_0"])
def test_qwen3_embedding_fixture_is_go(qwen3, gguf_type):
    report = run_gates(qwen3 / "source", qwen3 / f"tiny-qwen3-{gguf_type}.gguf", {1, 2, 3}, texts=ENGLISH)
    assert report.verdict == "GO", report.blockers
    details = runtime(report)
    assert details["embeddings"]["pooling"] == "last"
    assert details["tokenizer"]["template"]["suffix"] == details["tokenizer"]["llama_adds"]["suffix"] != []
    assert details["embeddings"]["retrieval"]["query_prompt"].startswith("Instruct:")


def test_qwen3_nfd_input_diverges_by_normalisation(qwen3, tmp_path):
    """Qwen's tokenizer.json normalises to NFC and llama.cpp does not. transformers 5's GGUF loader rebuilds
    the fixture's tokenizer without that normalizer, so a copy of the source gets it back, as Qwen ships it."""
    source = tmp_path / "source"
    shutil.copytree(qwen3 / "source", source)
    tokenizer = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer["normalizer"] = {"type": "NFC"}
    (source / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    report = run_gates(source, qwen3 / "tiny-qwen3-F32.gguf", {2})
    assert {b.code for b in report.blockers} >= {"tokenizer.ids_mismatch"}
    assert "NFC" in runtime(report)["tokenizer"]["diagnosis"]


@pytest.mark.coverage(arch="qwen3", types=("F32",), imatrix=False, proves="NO-GO",
                      gates="1,2,3", defect="add_eos flag flipped")
def test_qwen3_twin_without_add_eos_is_no_go(qwen3, tmp_path):
    twin = rewrite(qwen3 / "tiny-qwen3-F32.gguf", tmp_path / "no-eos.gguf",
                   set_keys={"tokenizer.ggml.add_eos_token": False})
    report = run_gates(qwen3 / "source", twin, {1, 2, 3}, texts=ENGLISH)
    assert "tokenizer.add_eos_mismatch" in codes(report)  # llama.cpp probed: it drops the EOS
    flagged = [b for b in report.blockers if b.code == "tokenizer.flag_mismatch"]
    assert [(b.gate, b.key) for b in flagged] == [("storage", "tokenizer.ggml.add_eos_token")]
    assert not [b for b in report.blockers if b.gate == "storage" and b.code != "tokenizer.flag_mismatch"]


@pytest.mark.coverage(arch="qwen3", types=("F32",), imatrix=False, proves="NO-GO",
                      gates="1,2,3", defect="a wrong pooling type")
def test_qwen3_twin_with_other_pooling_is_no_go(qwen3, tmp_path):
    twin = rewrite(qwen3 / "tiny-qwen3-F32.gguf", tmp_path / "mean.gguf", set_keys={"qwen3.pooling_type": 1})
    report = run_gates(qwen3 / "source", twin, {1, 2, 3}, texts=ENGLISH)
    assert "metadata.pooling_mismatch" in codes(report)
    assert "embedding.cosine_below_threshold" in codes(report)
    assert "pooling" in runtime(report)["embeddings"]["diagnosis"]


def test_gguf_flags_are_judged_by_behaviour_bert_always_adds_cls_sep(minilm, tmp_path):
    """llama.cpp's WPM tokenizer adds [CLS]/[SEP] whatever add_bos_token says: the check measures
    what llama.cpp does, so this twin still matches its template (and the flag is reported)."""
    twin = rewrite(minilm / "minilm-F16.gguf", tmp_path / "no-bos.gguf",
                   set_keys={"tokenizer.ggml.add_bos_token": False})
    report = run_gates(minilm / "source", twin, {2}, texts=ENGLISH)
    tokenizer = runtime(report)["tokenizer"]
    assert tokenizer["gguf_flags"]["add_bos_token"] is False
    assert tokenizer["llama_adds"]["prefix"] == tokenizer["template"]["prefix"] == [101]
    assert "tokenizer.add_bos_mismatch" not in codes(report)


@pytest.mark.coverage(arch="llama", types=("F32",), imatrix=False, proves="NO-GO",
                      gates="2", defect="add_bos flag flipped")
def test_spm_twin_without_add_bos_is_no_go(tiny_llama, tmp_path):
    twin = rewrite(tiny_llama / "tiny-llama-F32.gguf", tmp_path / "no-bos.gguf",
                   set_keys={"tokenizer.ggml.add_bos_token": False})
    report = run_gates(tiny_llama / "source", twin, {2}, texts=ENGLISH)
    assert "tokenizer.add_bos_mismatch" in codes(report)


def test_template_appending_a_non_eos_token_is_no_go(minilm, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(minilm / "source", source)
    data = json.loads((source / "tokenizer.json").read_text())
    data["post_processor"]["single"][-1] = {"SpecialToken": {"id": "[MASK]", "type_id": 0}}
    data["post_processor"]["special_tokens"]["[MASK]"] = {"id": "[MASK]", "ids": [103], "tokens": ["[MASK]"]}
    (source / "tokenizer.json").write_text(json.dumps(data))
    report = run_gates(source, minilm / "minilm-F16.gguf", {2}, texts=ENGLISH)
    assert {"tokenizer.template_token_mismatch", "tokenizer.add_eos_mismatch"} <= codes(report)


def test_wrong_digest_is_no_go_before_any_gate(minilm):
    report = run_gates(minilm / "source", minilm / "minilm-F16.gguf", {1, 2, 3}, expected_sha256="ab" * 32)
    assert codes(report) == {"artifact.sha256_mismatch"}
    assert {gate.status for gate in report.gates.values()} == {"not_run"}


def test_causal_lm_logits_parity_go(tiny_llama):
    report = run_gates(tiny_llama / "source", tiny_llama / "tiny-llama-F32.gguf", {2, 3}, texts=ENGLISH)
    logits = runtime(report)["logits"]["summary"]
    assert not [b for b in report.blockers if b.code.startswith(("logits.", "release."))], report.blockers
    assert logits["nmse"] < 1e-4 and logits["kl_mean"] < 1e-4 and logits["top1_agreement"] == 1.0
    assert report.gates["release"].details["top1_equal_to_gate2"] is True


@pytest.mark.coverage(arch="llama", types=("F32",), imatrix=False, proves="NO-GO",
                      gates="2", defect="output head scrambled")
def test_causal_lm_with_corrupted_output_head_is_refused_for_its_cost(tiny_llama, tmp_path):
    from tests.conftest import defect_copy

    def scramble(raw):
        values = raw.view("<f4")
        values[:] = values[::-1].copy()

    twin = defect_copy(tiny_llama / "tiny-llama-F32.gguf", tmp_path, "output.weight", scramble)
    report = run_gates(tiny_llama / "source", twin, {2}, texts=ENGLISH)
    # llama.cpp runs the scrambled head as transformers runs it (correctness holds); what the file costs
    # against the source is far past the float budget. Gate 1 names the tensor (tensor.value_mismatch).
    assert "quality.kl_above_budget" in codes(report), report.blockers
    assert not {code for code in codes(report) if code.startswith("logits.")}


def test_a_text_longer_than_the_context_is_skipped_and_reported(minilm):
    too_long = "verification " * 700
    report = run_gates(minilm / "source", minilm / "minilm-F16.gguf", {2}, texts=(*ENGLISH, too_long))
    assert report.verdict == "GO", report.blockers
    assert runtime(report)["skipped_texts"] == ["line-5"]
    assert "texts longer than the context, not measured: line-5" in report.not_verified
