"""Each gate-2 check, fed measurements with exactly one thing wrong, must say so (the ruler can fail)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from engine.gates.runtime.embedding_parity import check_embeddings
from engine.gates.runtime.logits_parity import check_logits
from engine.gates.runtime.tokenizer_parity import check_tokenizer, template_facts
from engine.policy import Policy
from engine.runtime.sentence_config import SentenceConfig
from engine.texts import RETRIEVAL, Text

TEXTS = (Text("a", "alpha beta"), Text("b", "gamma delta"), Text("k", "한국어"))
SENTENCE = SentenceConfig("mean", True, {})
TEMPLATE = {"post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}},
                                          {"SpecialToken": {"id": "</s>"}}],
                               "special_tokens": {"<s>": {"ids": [1]}, "</s>": {"ids": [2]}}}}
META = {"tokenizer.ggml.eos_token_id": 2}


def word_ids(text: str) -> list[int]:
    return [10 + sum(map(ord, word)) % 1000 for word in text.split()]


def tokenizer(prefix=(1,), suffix=(2,), mangle_non_ascii=False):
    def tokenize(text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        ids = word_ids(text)
        if mangle_non_ascii and not text.isascii():
            ids = [i + 1 for i in ids]
        return [*prefix, *ids, *suffix] if add_special else ids
    return tokenize


def test_identical_tokenizers_match_in_every_combination():
    result = check_tokenizer(TEXTS, tokenizer(), tokenizer(), TEMPLATE, META, ids_exact=True)
    assert not result.blockers and len(result.matching_combinations) == 4


def test_missing_eos_is_a_constant_offset_and_an_add_eos_mismatch():
    result = check_tokenizer(TEXTS, tokenizer(), tokenizer(suffix=()), TEMPLATE, META, ids_exact=True)
    found = {b.code for b in result.blockers}
    assert "tokenizer.add_eos_mismatch" in found
    assert "constant length offset of -1" in result.diagnosis
    assert result.matching_combinations == ["add_special=False,parse_special=True",
                                            "add_special=False,parse_special=False"]


def test_missing_bos_is_an_add_bos_mismatch():
    result = check_tokenizer(TEXTS, tokenizer(), tokenizer(prefix=()), TEMPLATE, META, ids_exact=True)
    assert "tokenizer.add_bos_mismatch" in {b.code for b in result.blockers}


def test_non_ascii_divergence_names_the_text_and_normalisation():
    result = check_tokenizer(TEXTS, tokenizer(), tokenizer(mangle_non_ascii=True), TEMPLATE, META, ids_exact=True)
    mismatched = [b for b in result.blockers if b.code == "tokenizer.ids_mismatch"]
    assert [b.text for b in mismatched] == ["한국어"]
    assert "non-ASCII" in result.diagnosis


def test_ids_mismatch_is_reported_but_not_blocking_when_policy_allows():
    result = check_tokenizer(TEXTS, tokenizer(), tokenizer(mangle_non_ascii=True), TEMPLATE, META, ids_exact=False)
    assert not result.blockers and result.mismatches


def test_template_appending_two_tokens_cannot_be_represented():
    template = {"post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 1], "sep": ["[SEP]", 3]}}
    assert template_facts(template).suffix == (3,)
    result = check_tokenizer(TEXTS, tokenizer(suffix=(3,)), tokenizer(suffix=(3,)), template, META, ids_exact=True)
    assert [b.code for b in result.blockers] == ["tokenizer.template_token_mismatch"]


def embedder(seed: int, *, scale: float = 0.0, nan: bool = False, permute: bool = False):
    """Deterministic 'model': a vector per text; `scale` adds noise, `permute` breaks retrieval."""
    documents = set(RETRIEVAL.documents)

    def embed(text: str) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(text.encode()))
        base = rng.standard_normal(32)
        if permute and text in documents:
            base = -base
        noise = np.random.default_rng(seed + len(text)).standard_normal(32) * scale
        out = base + noise
        if nan:
            out[0] = np.nan
        return out
    return embed


ALL_EQUAL = {t.label: True for t in TEXTS}


DEFAULT_POLICY = Policy()


def embedding_codes(candidate, ids_equal=ALL_EQUAL) -> list[str]:
    result = check_embeddings(TEXTS, embedder(0), candidate, SENTENCE, ids_equal, DEFAULT_POLICY,
                              DEFAULT_POLICY.thresholds(["f32"]))
    return sorted({b.code for b in result.blockers})


def test_identical_embeddings_pass():
    assert embedding_codes(embedder(0)) == []


def test_noisy_embeddings_fall_below_cosine_threshold():
    assert "embedding.cosine_below_threshold" in embedding_codes(embedder(1, scale=0.3))


def test_retrieval_top1_change_is_caught():
    assert "embedding.top1_mismatch" in embedding_codes(embedder(0, permute=True))


def test_non_finite_candidate_is_caught():
    assert "embedding.not_finite" in embedding_codes(embedder(0, nan=True))


def test_ids_differ_but_cosine_perfect_is_a_contradiction():
    ids_equal = dict(ALL_EQUAL, k=False)
    assert embedding_codes(embedder(0), ids_equal) == ["measurement.contradiction"]


def test_ids_equal_but_cosine_low_is_a_contradiction():
    found = embedding_codes(embedder(2, scale=3.0))
    assert "measurement.contradiction" in found and "embedding.cosine_below_threshold" in found


def fake_logits(noise: float, shift_top1: bool = False):
    def logits(ids: list[int]) -> np.ndarray:
        rng = np.random.default_rng(len(ids))
        out = rng.standard_normal((len(ids), 50)) * 4
        out += np.random.default_rng(99).standard_normal(out.shape) * noise
        if shift_top1:
            out[np.arange(len(ids)), (out.argmax(-1) + 1) % 50] = out.max() + 10
        return out
    return logits


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [(fake_logits(0.0), set()),
     (fake_logits(2.0), {"logits.nmse_above_threshold", "logits.kl_above_threshold", "logits.top1_below_threshold"}),
     (fake_logits(0.0, shift_top1=True), {"logits.top1_below_threshold", "logits.kl_above_threshold",
                                          "logits.nmse_above_threshold"})],
    ids=["identical", "noisy", "top-1 moved"],
)
def test_logits_thresholds(candidate, expected):
    result = check_logits(TEXTS, word_ids, fake_logits(0.0), candidate, Policy(), Policy().thresholds(["f32"]))
    assert {b.code for b in result.blockers} == expected
    assert result.summary["positions"] == sum(len(word_ids(t.text)) for t in TEXTS)


def test_non_finite_logits_are_caught():
    def broken(ids):
        out = fake_logits(0.0)(ids)
        out[0, 0] = np.inf
        return out

    result = check_logits(TEXTS, word_ids, fake_logits(0.0), broken, Policy(), Policy().thresholds(["f32"]))
    assert {b.code for b in result.blockers} == {"logits.not_finite"}


def test_the_same_drift_is_no_go_for_float_arithmetic_and_go_for_8_bit_activations():
    """llama.cpp multiplies a K-quant's weights with activations rounded to 8 bits: a drift that arithmetic
    honestly shows on a trained model is a defect where the arithmetic is float32."""
    drift = fake_logits(0.05)
    found = {cls: {b.code for b in check_logits(TEXTS, word_ids, fake_logits(0.0), drift, Policy(),
                                                Policy().thresholds([cls])).blockers}
             for cls in ("f32", "q8_k")}
    assert "logits.kl_above_threshold" in found["f32"]
    assert found["q8_k"] == set()
    noisy = embedder(3, scale=0.01)
    per_class = {cls: embedding_thresholds_codes(noisy, cls) for cls in ("f32", "q8_k")}
    assert "embedding.cosine_below_threshold" in per_class["f32"]
    assert "embedding.cosine_below_threshold" not in per_class["q8_k"]


def embedding_thresholds_codes(candidate, compute) -> set[str]:
    result = check_embeddings(TEXTS, embedder(0), candidate, SENTENCE, ALL_EQUAL, DEFAULT_POLICY,
                              DEFAULT_POLICY.thresholds([compute]))
    return {b.code for b in result.blockers}


def tied_logits(ids: list[int]) -> np.ndarray:
    """Every other position is a near-tie: its two best tokens 0.001 apart; the others 3 apart."""
    out = np.zeros((len(ids), 50))
    out[:, 7] = 5.0
    out[:, 9] = np.where(np.arange(len(ids)) % 2 == 0, 4.999, 2.0)
    return out


def flipped(ids: list[int], positions: str = "ties") -> np.ndarray:
    """The near-ties' two best tokens swapped (a rounding's worth), or every position's."""
    out = tied_logits(ids)
    rows = np.arange(len(ids)) if positions == "all" else np.arange(0, len(ids), 2)
    out[rows, 7], out[rows, 9] = out[rows, 9], out[rows, 7]
    return out


def test_a_near_tie_that_flips_does_not_count_against_top1_agreement():
    thresholds = Policy().thresholds(["f32"]).model_copy(update={"tie_margin": 0.01, "max_kl_mean": 1.0,
                                                                  "max_kl_p99": 1.0, "max_logits_nmse": 1.0})
    result = check_logits(TEXTS, word_ids, tied_logits, flipped, Policy(), thresholds)
    summary = result.summary
    assert summary["top1_agreement_raw"] < 0.6 and summary["top1_agreement"] == 1.0
    assert summary["near_ties"] + summary["decisive_positions"] == summary["positions"]
    assert summary["near_ties"] == sum((len(word_ids(t.text)) + 1) // 2 for t in TEXTS)
    assert summary["margin_moved_max"] == pytest.approx(0.002)
    assert not result.blockers
    counting_ties = check_logits(TEXTS, word_ids, tied_logits, flipped, Policy(),
                                 thresholds.model_copy(update={"tie_margin": 0.0}))
    assert {b.code for b in counting_ties.blockers} == {"logits.top1_below_threshold"}


def test_a_decisive_position_that_flips_counts():
    thresholds = Policy().thresholds(["f32"]).model_copy(update={"tie_margin": 0.01})
    result = check_logits(TEXTS, word_ids, tied_logits, lambda ids: flipped(ids, "all"), Policy(), thresholds)
    assert result.summary["top1_agreement"] == 0.0
    top1 = [b for b in result.blockers if b.code == "logits.top1_below_threshold"]
    assert top1 and "decisive positions" in top1[0].why


def test_no_decisive_position_measures_no_top1_agreement():
    thresholds = Policy().thresholds(["f32"]).model_copy(update={"tie_margin": 10.0, "max_kl_mean": 10.0,
                                                                  "max_kl_p99": 10.0, "max_logits_nmse": 10.0})
    result = check_logits(TEXTS, word_ids, tied_logits, lambda ids: flipped(ids, "all"), Policy(), thresholds)
    assert "top1_agreement" not in result.summary and result.summary["decisive_positions"] == 0
    assert not result.blockers
