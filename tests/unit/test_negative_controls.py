"""The negative controls piece by piece: where a defect is planted, how far, and what counts as detected -
gate 2's on recorded answers of small deterministic fakes, gate 1's on a real conversion."""

from __future__ import annotations

import hashlib
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.blockers import Blocker
from engine.controls.planted import Planted, newly_raised, not_applicable
from engine.controls.run import ControlInputs, run_controls, undetected
from engine.formats.ggml_types import GGMLType
from engine.formats.gguf_structure import TensorInfo, read_layout
from engine.formats.source import open_source
from engine.gates.release import controls as release_control_module
from engine.gates.release import digest as release
from engine.gates.runtime import embedding_parity, logits_parity, tokenizer_parity
from engine.gates.runtime.controls import embedding_control, logits_control, other_id, tokenizer_control, turned_away
from engine.gates.runtime.evidence import (
    EmbeddingEvidence,
    LogitsEvidence,
    Recorded,
    RuntimeEvidence,
    TokenizerEvidence,
)
from engine.gates.runtime.gate import RuntimeMeasurements
from engine.gates.runtime.logits_stream import KeptBlock
from engine.gates.storage import tensor_values
from engine.gates.storage.controls import _row_weights, candidates_by_type, one_row, plant_site, storage_controls
from engine.policy import Policy
from engine.quant.imatrix import read_imatrix
from engine.report import Control
from engine.runtime.sentence_config import SentenceConfig
from engine.texts import Text
from tests.conftest import defect_copy

TEXTS = (Text("one", "alpha beta gamma delta"), Text("two", "epsilon zeta"), Text("three", "eta"))
CLS, SEP = 101, 102
F32, Q8_0, Q6_K = (GGMLType(0, "F32", 1, 4), GGMLType(8, "Q8_0", 32, 34), GGMLType(14, "Q6_K", 256, 210))


def words(text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    """A toy tokenizer both sides share: a word's id from its crc, [CLS] ... [SEP] with add_special."""
    ids = [1000 + zlib.crc32(word.encode()) % 5000 for word in text.split()]
    return [CLS, *ids, SEP] if add_special else ids


def tokenizer_evidence(texts: tuple[Text, ...] = TEXTS, *, exact: bool = True,
                       llama=words) -> tuple[TokenizerEvidence, Any]:
    hf, ll = Recorded(words), Recorded(llama)
    tokenizer_json = {"post_processor": {"type": "BertProcessing", "cls": ["[CLS]", CLS], "sep": ["[SEP]", SEP]}}
    honest = tokenizer_parity.check_tokenizer(texts, hf, ll, tokenizer_json, {}, exact)
    evidence = TokenizerEvidence(hf=hf, llama=ll, tokenizer_json=tokenizer_json, metadata={}, ids_exact=exact,
                                 default_ids_equal=dict(honest.default_ids_equal), blockers=tuple(honest.blockers))
    return evidence, honest


def spy(monkeypatch, module, name: str) -> list[Any]:
    """Results of every call of `module.name`, which still does its real work."""
    real, seen = getattr(module, name), []

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(module, name, recording)
    return seen


# --- what a control found -------------------------------------------------------------------------

def test_an_outcome_follows_what_was_raised():
    assert Planted(check="c", defect="d", detected_by=("x",)).outcome == "detected"
    assert Planted(check="c", defect="d", detected_by=()).outcome == "not_detected"
    assert not_applicable("c", "because").outcome == "not_applicable"
    assert not_applicable("c", "because").why == "because"


def test_only_blockers_the_honest_run_lacked_count():
    old = Blocker(code="tokenizer.ids_mismatch", gate="runtime", why="w", text="a")
    same_code_other_text = Blocker(code="tokenizer.ids_mismatch", gate="runtime", why="w", text="b")
    other = Blocker(code="embedding.top1_mismatch", gate="runtime", why="w")
    assert newly_raised([old], [old]) == ()
    assert newly_raised([old, same_code_other_text, other, other], [old]) == (
        "embedding.top1_mismatch", "tokenizer.ids_mismatch")


def control(outcome: str, **extra: Any) -> Control:
    return Control(gate="storage", check="tensor values", defect="one F32 weight moved by one ulp",
                   location="t row 1 element 2", outcome=outcome, seconds=0.1, **extra)  # type: ignore[arg-type]


def test_each_undetected_control_is_one_blocker_naming_it():
    (blocker,) = undetected([control("detected"), control("not_detected"), control("not_applicable")])
    assert (blocker.code, blocker.gate) == ("verifier.control_not_detected", "verifier")
    assert blocker.why.startswith("one F32 weight moved by one ulp at t row 1 element 2 (planted in memory) "
                                  "passed gate storage's tensor values comparison")


# --- gate 2: tokenizer ----------------------------------------------------------------------------

def test_a_changed_token_id_is_caught_in_the_middle_of_the_first_matching_text(monkeypatch):
    evidence, _ = tokenizer_evidence()
    seen = spy(monkeypatch, tokenizer_parity, "check_tokenizer")
    planted = tokenizer_control(TEXTS, evidence)
    assert planted.detected_by == ("tokenizer.ids_mismatch",)
    ids = words(TEXTS[0].text, add_special=True, parse_special=False)
    assert planted.location == "text 'one' position 3"
    assert planted.defect == f"one llama.cpp token id changed ({ids[3]} -> {ids[3] - 1})"
    (mismatch,) = seen[0].mismatches
    assert mismatch["label"] == "one" and mismatch["first_divergence"] == 3
    assert mismatch["llama_ids"] == [*ids[:3], ids[3] - 1, *ids[4:]]
    assert seen[0].per_combination == {name: 2 for name in seen[0].per_combination}  # every combination


def test_the_tokenizer_control_skips_texts_that_already_differ():
    def llama(text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        ids = words(text, add_special=add_special, parse_special=parse_special)
        return [*ids, 7] if text == TEXTS[0].text else ids

    evidence, honest = tokenizer_evidence(llama=llama)
    assert honest.blockers  # the first text differs already
    planted = tokenizer_control(TEXTS, evidence)
    assert planted.location == "text 'two' position 2" and planted.detected_by == ("tokenizer.ids_mismatch",)


def test_the_tokenizer_control_needs_exact_ids_and_a_matching_text():
    lax = tokenizer_control(TEXTS, tokenizer_evidence(exact=False)[0])
    assert (lax.outcome, lax.check, lax.defect) == ("not_applicable", "tokenizer ids", "none planted")
    evidence, _ = tokenizer_evidence(llama=lambda text, **flags: [*words(text, **flags), 7])
    differs = tokenizer_control(TEXTS, evidence)
    assert (differs.outcome, differs.check) == ("not_applicable", "tokenizer ids")
    assert differs.why == "no text's token ids matched: nothing honest to plant in"


def test_a_tokenizer_comparison_that_always_agrees_misses_the_planted_id(monkeypatch):
    monkeypatch.setattr(tokenizer_parity, "ids_agree", lambda hf_ids, llama_ids: True)
    assert tokenizer_control(TEXTS, tokenizer_evidence()[0]).outcome == "not_detected"


def test_other_id_is_a_neighbour():
    assert (other_id(0), other_id(1), other_id(500)) == (1, 0, 499)


# --- gate 2: embeddings ---------------------------------------------------------------------------

def vector(text: str, dim: int = 16) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(text.encode())).standard_normal(dim).astype(np.float32)


def near(text: str) -> np.ndarray:
    return vector(text) + np.float32(1e-5) * vector(text + "!")


def embedding_evidence(candidate=near) -> EmbeddingEvidence:
    policy = Policy()
    thresholds = policy.thresholds(["f32"])
    sentence = SentenceConfig(pooling="mean", normalize=True)
    reference, embed = Recorded(vector), Recorded(candidate)
    ids_equal = {t.label: True for t in TEXTS}
    honest = embedding_parity.check_embeddings(TEXTS, reference, embed, sentence, ids_equal, policy, thresholds)
    return EmbeddingEvidence(reference=reference, candidate=embed, sentence=sentence, ids_equal=ids_equal,
                             policy=policy, thresholds=thresholds, per_text=tuple(honest.per_text),
                             blockers=tuple(honest.blockers))


@pytest.mark.parametrize("cosine", [0.999994, 0.5, -0.25])
def test_turned_away_lands_exactly_on_the_cosine_and_keeps_the_norm(cosine):
    ref, cand = vector("r").astype(np.float64), near("r").astype(np.float64) * 3
    turned = turned_away(ref, cand, cosine)
    assert float(ref @ turned / (np.linalg.norm(ref) * np.linalg.norm(turned))) == pytest.approx(cosine, abs=1e-9)
    assert np.linalg.norm(turned) == pytest.approx(np.linalg.norm(cand), rel=1e-9)
    away = cand - (cand @ ref) / (ref @ ref) * ref
    assert float(away @ turned) > 0  # along the candidate's own deviation, not against it


def test_turned_away_from_an_identical_candidate_uses_a_fixed_axis():
    ref = np.array([3.0, 0.5, -2.0, 1.0])
    turned = turned_away(ref, ref.copy(), 0.8)
    assert float(ref @ turned / (np.linalg.norm(ref) * np.linalg.norm(turned))) == pytest.approx(0.8, abs=1e-12)
    assert turned[1] > 0 and np.linalg.norm(turned) == pytest.approx(np.linalg.norm(ref))
    assert float(turned_away(ref, ref, -3.0) @ ref) == pytest.approx(-float(ref @ ref))  # clamped at -1


def test_an_embedding_turned_to_twice_the_deficit_is_caught(monkeypatch):
    evidence = embedding_evidence()
    seen = spy(monkeypatch, embedding_parity, "check_embeddings")
    planted = embedding_control(TEXTS, evidence)
    assert "embedding.cosine_below_threshold" in (planted.detected_by or ())
    threshold = evidence.thresholds.min_cosine
    rows = {row["label"]: row for row in seen[0].per_text}
    assert rows["one"]["cosine"] == pytest.approx(1 - 2 * (1 - threshold), abs=1e-6)  # float32 norms
    assert rows["two"]["cosine"] >= threshold and planted.location == "text 'one'"
    assert f"(twice the deficit min_cosine {threshold} allows)" in planted.defect


def test_the_embedding_control_plants_in_a_text_that_passed():
    def far_on_one(text: str) -> np.ndarray:
        return vector("other") if text == TEXTS[0].text else near(text)

    assert embedding_control(TEXTS, embedding_evidence(far_on_one)).location == "text 'two'"
    far = embedding_control(TEXTS, embedding_evidence(lambda t: vector("x")))
    assert (far.outcome, far.check) == ("not_applicable", "embeddings")
    exactly = embedding_evidence()
    exactly = EmbeddingEvidence(**{**exactly.__dict__, "thresholds": exactly.thresholds.model_copy(
        update={"min_cosine": exactly.per_text[0]["cosine"]})})
    assert embedding_control(TEXTS, exactly).location == "text 'one'"  # a cosine equal to the minimum passes


# --- gate 2: logits -------------------------------------------------------------------------------

def ids_of(text: str) -> list[int]:
    return words(text, add_special=True, parse_special=False)


def logits_of(ids: list[int]) -> np.ndarray:
    return np.random.default_rng(sum(ids)).standard_normal((len(ids), 32)).astype(np.float32)


def logits_evidence(candidate=None, texts: tuple[Text, ...] = TEXTS) -> LogitsEvidence:
    """What gate 2 keeps: the first text's first positions, both sides (test_logits_stream.py checks how many)."""
    policy = Policy()

    def close(ids: list[int]) -> np.ndarray:
        return logits_of(ids) + np.float32(1e-4) * logits_of([*ids[1:], 1])

    ids = ids_of(texts[0].text)
    kept = KeptBlock(texts[0], tuple(ids), logits_of(ids), (candidate or close)(ids))
    return LogitsEvidence(kept=kept, policy=policy, thresholds=policy.thresholds(["f32"]))


def test_the_first_texts_logits_pushed_to_twice_the_nmse_are_caught(monkeypatch):
    evidence = logits_evidence()
    seen = spy(monkeypatch, logits_parity, "check_logits")
    planted = logits_control(TEXTS, evidence)
    assert planted.detected_by and "logits.nmse_above_threshold" in planted.detected_by
    honest, pushed = seen
    assert honest.summary["nmse"] < evidence.thresholds.max_logits_nmse
    assert pushed.summary["nmse"] == pytest.approx(2 * evidence.thresholds.max_logits_nmse, rel=1e-6)
    assert planted.location == "text 'one'" and pushed.summary["positions"] == 6
    assert "NMSE " + f"{2 * evidence.thresholds.max_logits_nmse:.3g}" in planted.defect


def test_logits_already_failing_exact_or_missing_are_handled():
    failing = logits_control(TEXTS, logits_evidence(lambda ids: -logits_of(ids)))
    assert (failing.outcome, failing.check, failing.why) == ("not_applicable", "logits",
                                                             "the first text's logits already fail")
    exact = logits_control(TEXTS, logits_evidence(logits_of))  # no error to be orthogonal to
    assert exact.detected_by and "logits.nmse_above_threshold" in exact.detected_by
    assert logits_control((), logits_evidence()).outcome == "not_applicable"
    assert logits_control(TEXTS[1:], logits_evidence()).outcome == "not_applicable"  # only the first is kept
    none = LogitsEvidence(kept=None, policy=Policy(), thresholds=Policy().thresholds(["f32"]))
    assert logits_control(TEXTS, none).why == "the first text's logits were not measured"


def test_non_finite_first_logits_are_not_planted_in():
    def nan_on_one(ids: list[int]) -> np.ndarray:
        return np.full((len(ids), 32), np.nan, np.float32) if ids == ids_of(TEXTS[0].text) else logits_of(ids)

    assert logits_control(TEXTS, logits_evidence(nan_on_one)).outcome == "not_applicable"


# --- gate 3 ---------------------------------------------------------------------------------------

def test_one_flipped_byte_of_the_released_file_changes_its_digest(tmp_path: Path, monkeypatch):
    artifact = tmp_path / "a.gguf"
    content = bytes([1]) * 2048  # the middle byte is 1: flipping its low bit is not setting it
    artifact.write_bytes(content)
    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()
    planted = release_control_module.release_control(artifact, digest)
    assert (planted.detected_by, planted.location) == (("release.file_changed",), "byte 1024")
    assert (planted.check, planted.defect) == ("release digest", "one bit of the released file flipped")
    assert artifact.read_bytes() == content  # copy-on-write: the file is untouched
    seen = spy(monkeypatch, release, "digest_changed")
    release_control_module.release_control(artifact, digest)
    assert seen[0] is not None and seen[0].why.startswith("a.gguf changed")
    assert release.digest_changed(hashlib.sha256(content[:1024] + b"\x00" + content[1025:]).hexdigest(), digest,
                                  "a.gguf") is not None
    monkeypatch.undo()
    monkeypatch.setattr(release, "digest_changed", lambda actual, measured, name: None)
    assert release_control_module.release_control(artifact, digest).outcome == "not_detected"


def test_the_digest_comparison():
    assert release.digest_changed("a" * 64, "a" * 64, "f") is None
    changed = release.digest_changed("a" * 64, "b" * 64, "f.gguf")
    assert changed is not None and changed.code == "release.file_changed" and changed.why.startswith("f.gguf ")


# --- orchestration --------------------------------------------------------------------------------

def inputs(tmp_path: Path, **extra: Any) -> ControlInputs:
    artifact = tmp_path / "a.gguf"
    artifact.write_bytes(b"GGUF" + bytes(100))
    return ControlInputs(artifact=artifact, artifact_sha256=hashlib.sha256(artifact.read_bytes()).hexdigest(),
                         layout=None, source=None, policy=Policy(), **extra)  # type: ignore[arg-type]


def test_controls_run_for_the_gates_that_ran_in_gate_order(tmp_path, monkeypatch):
    evidence = RuntimeEvidence(texts=TEXTS, tokenizer=tokenizer_evidence()[0], embeddings=embedding_evidence(),
                               logits=logits_evidence())
    measured = RuntimeMeasurements("embedding", 64, evidence=evidence)
    found = run_controls(inputs(tmp_path, runtime=measured, gates_run=frozenset({"release", "runtime"})))
    assert [(c.gate, c.check, c.outcome) for c in found] == [
        ("runtime", "tokenizer ids", "detected"), ("runtime", "embeddings", "detected"),
        ("runtime", "logits", "detected"), ("release", "release digest", "detected")]
    assert all(c.seconds >= 0 for c in found)
    assert run_controls(inputs(tmp_path)) == []
    measured_digests: list[str] = []
    monkeypatch.setattr(release, "digest_changed",
                        lambda actual, measured, name: measured_digests.append(measured))
    run_controls(inputs(tmp_path, gates_run=frozenset({"release"})))
    assert measured_digests == [inputs(tmp_path).artifact_sha256]
    (only,) = run_controls(inputs(tmp_path, gates_run=frozenset({"runtime"})))
    assert (only.outcome, only.why) == ("not_applicable", "gate 2 measured nothing to plant a defect in")
    (bare,) = run_controls(inputs(tmp_path, runtime=RuntimeMeasurements("embedding", 64),
                                  gates_run=frozenset({"runtime"})))
    assert bare.outcome == "not_applicable"


def test_gate1_controls_share_their_seconds(minilm):
    artifact = minilm / "minilm-Q8_0.gguf"
    chosen = ControlInputs(artifact=artifact, artifact_sha256="ef" * 32, layout=read_layout(artifact),
                           source=open_source(minilm / "source"), policy=Policy(), gates_run=frozenset({"storage"}))
    started = time.perf_counter()
    found = run_controls(chosen)
    elapsed = time.perf_counter() - started
    assert [(c.gate, c.outcome) for c in found] == [("storage", "detected")] * 2
    assert found[0].seconds == found[1].seconds and 0 < 2 * found[0].seconds <= elapsed
    assert [c.detected_by for c in found] == [["tensor.value_mismatch"],
                                              ["tensor.reproduction_mismatch", "tensor.value_mismatch"]]


def test_a_control_that_cannot_run_counts_as_not_detected(tmp_path):
    broken = RuntimeEvidence(texts=(Text("one", "never measured"),), tokenizer=tokenizer_evidence()[0])
    (found,) = run_controls(inputs(tmp_path, runtime=RuntimeMeasurements("embedding", 64, evidence=broken),
                                   gates_run=frozenset({"runtime"})))
    assert (found.outcome, found.check, found.detected_by) == ("not_detected", "runtime", [])
    assert found.why is not None and found.why.startswith("KeyError: ")
    assert found.defect == "a control that could not run"
    assert [b.code for b in undetected([found])] == ["verifier.control_not_detected"]


# --- gate 1 ---------------------------------------------------------------------------------------

def info(ggml_type: GGMLType, shape: tuple[int, ...], offset: int = 1000) -> TensorInfo:
    n = int(np.prod(shape))
    return TensorInfo(name="t", shape=shape, ggml_type=ggml_type, offset=offset,
                      nbytes=n // ggml_type.block_size * ggml_type.type_size)


def test_one_row_is_the_rows_bytes_as_a_tensor():
    row = one_row(info(Q8_0, (64, 5)), 3)
    assert (row.shape, row.offset, row.nbytes, row.name) == ((64, 1), 1000 + 3 * 68, 68, "t")


def test_plant_sites():
    policy = Policy()
    assert plant_site(info(F32, (10, 1)), policy, None) == (1020, "one F32 weight moved by one ulp", "element 5")
    assert plant_site(info(Q8_0, (96, 1)), policy, None) == (1035, "one Q8_0 block's scale moved by 256 ulps",
                                                             "block 1 byte 1")
    assert plant_site(info(Q6_K, (768, 1)), policy, None) == (1000 + 210 + 208 + 1,
                                                              "one Q6_K block's scale moved by 256 ulps",
                                                              "block 1 byte 209")
    odd = GGMLType(99, "IQ2_XXS", 256, 66)
    assert plant_site(info(odd, (512, 1)), policy, None) == (1067, "one bit of one IQ2_XXS block flipped",
                                                             "block 1 byte 1")


def test_a_sampled_reproduction_is_planted_in_its_first_sampled_block():
    policy = Policy(reproduce_sample=0.25)
    from engine.quant.sampling import block_sample

    first = int(np.flatnonzero(block_sample("ab" * 32, "t", 40, 0.25))[0])
    assert first != 20  # not the middle block a full reproduction would get
    byte, _, where = plant_site(info(Q6_K, (256 * 40, 1)), policy, "ab" * 32)
    assert (byte, where) == (1000 + first * 210 + 209, f"block {first} byte 209")
    assert plant_site(info(Q8_0, (32 * 40, 1)), policy, "ab" * 32)[2] == "block 20 byte 1"  # Q8_0 is not sampled


def test_candidates_per_type_smallest_first_by_name(monkeypatch):
    tensors = {"b": info(F32, (8, 2)), "a": info(F32, (8, 2)), "c": info(F32, (4, 2)), "d": info(F32, (64, 2)),
               "e": info(F32, (32, 2)), "q": info(Q8_0, (64, 2)), "r": info(Q8_0, (32, 2))}

    class Layout:
        def tensor(self, name: str) -> TensorInfo:
            return tensors[name]

    names = dict(enumerate(["b", "a", "q", "c", "d", "r", "e"]))
    assert candidates_by_type(Layout(), names) == {"F32": [3, 1, 0], "Q8_0": [5, 2]}  # type: ignore[arg-type]
    assert list(candidates_by_type(Layout(), {0: "q", 1: "a"})) == ["F32", "Q8_0"]  # type: ignore[arg-type]


def test_row_weights_follow_the_matrix_of_the_row():
    class Matrix:
        def __init__(self, weights):
            self.weights = weights

        def weights_for(self, name, shape):
            return self.weights

    flat, stacked = np.arange(64.0), np.arange(3 * 64.0).reshape(3, 64)
    assert _row_weights(None, info(Q8_0, (64, 4)), 1) is None
    assert _row_weights(Matrix(flat), info(F32, (64, 4)), 1) is None  # floats are not weighted
    assert _row_weights(Matrix(None), info(Q8_0, (64, 4)), 1) is None
    assert _row_weights(Matrix(flat), info(Q8_0, (64, 4)), 1) is flat  # type: ignore[arg-type]
    chosen = _row_weights(Matrix(stacked), info(Q8_0, (64, 4, 3)), 9)  # type: ignore[arg-type]
    assert chosen is not None and np.array_equal(chosen, stacked[2])


def test_gate1_controls_on_a_real_conversion(minilm, monkeypatch):
    artifact = minilm / "minilm-Q8_0.gguf"
    layout, source = read_layout(artifact), open_source(minilm / "source")
    before = hashlib.sha256(artifact.read_bytes()).hexdigest()
    found = storage_controls(artifact, layout, source, Policy(), None, "cd" * 32)
    assert [(p.defect, p.detected_by) for p in found] == [
        ("one F32 weight moved by one ulp", ("tensor.value_mismatch",)),
        ("one Q8_0 block's scale moved by 256 ulps", ("tensor.reproduction_mismatch", "tensor.value_mismatch"))]
    assert found[0].location == "blk.0.attn_k.bias row 0 element 192"
    assert found[1].location == "blk.0.attn_k.weight row 192 block 6 byte 1"
    assert hashlib.sha256(artifact.read_bytes()).hexdigest() == before
    monkeypatch.setattr(tensor_values, "_judge", lambda *args, **kwargs: [])
    assert {p.outcome for p in storage_controls(artifact, layout, source, Policy(), None, None)} == {"not_detected"}


def test_gate1_controls_skip_a_row_that_fails_honestly(minilm, tmp_path):
    artifact = defect_copy(minilm / "minilm-F32.gguf", tmp_path, "blk.0.attn_k.bias",
                           lambda raw: raw.view("<f4").__setitem__(192, 7.0))
    layout, source = read_layout(artifact), open_source(minilm / "source")
    (planted,) = storage_controls(artifact, layout, source, Policy(), None, None)
    assert planted.location == "blk.0.attn_output.bias row 0 element 192"  # the next smallest F32 tensor
    assert planted.detected_by == ("tensor.value_mismatch",)


def test_gate1_controls_without_an_exact_check_or_a_map(imatrix_fixture, tiny_llama, minilm):
    artifact = imatrix_fixture / "tiny-llama-Q4_K_M-imat.gguf"
    layout, source = read_layout(artifact), open_source(tiny_llama / "source")
    found = {p.defect.split()[1] if p.outcome != "not_applicable" else p.why: p
             for p in storage_controls(artifact, layout, source, Policy(), None, None)}
    assert found["F32"].outcome == "detected"
    assert "no Q4_K tensor has an exact check and a middle row that passes" in found  # needs its imatrix
    bert = open_source(minilm / "source")
    (none,) = storage_controls(artifact, layout, bert, Policy(), None, None)  # llama file, bert config
    assert (none.outcome, none.why) == ("not_applicable", "gate 1 paired no tensor: nothing to plant a defect in")


def test_gate1_controls_follow_the_row_transform_and_the_importance_matrix(tiny_llama, imatrix_fixture):
    artifact = tiny_llama / "tiny-llama-Q8_0.gguf"
    source = open_source(tiny_llama / "source")
    found = storage_controls(artifact, read_layout(artifact), source, Policy(), None, None)
    assert [p.location for p in found] == ["blk.0.attn_norm.weight row 0 element 128",
                                           "blk.0.attn_k.weight row 64 block 4 byte 1"]  # Q/K rows permuted
    weighted = imatrix_fixture / "tiny-llama-Q4_K_M-imat.gguf"
    matrix = read_imatrix(imatrix_fixture / "imatrix-english.gguf")
    by_type = {p.defect.split()[1]: p for p in storage_controls(weighted, read_layout(weighted), source, Policy(),
                                                                 matrix, None) if p.outcome != "not_applicable"}
    assert by_type["Q4_K"].detected_by == ("tensor.reproduction_mismatch", "tensor.value_mismatch")


def test_gate1_controls_check_the_planted_row_as_the_honest_one(imatrix_fixture, tiny_llama, monkeypatch):
    source = open_source(tiny_llama / "source")
    matrix = read_imatrix(imatrix_fixture / "imatrix-english.gguf")
    calls: list[dict[str, Any]] = []
    real = tensor_values.check_tensor

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append({"row": args[1], **kwargs})
        return real(*args, **kwargs)

    monkeypatch.setattr(tensor_values, "check_tensor", recording)
    artifact = imatrix_fixture / "tiny-llama-IQ4_XS-imat.gguf"
    found = storage_controls(artifact, read_layout(artifact), source, Policy(reproduce_sample=0.5), matrix, "ab" * 32)
    assert {p.defect.split()[1]: p.outcome for p in found}["IQ4_XS"] == "detected"  # reproduced only when weighted
    weighted = [call for call in calls if call["quant_weights"] is not None]
    assert weighted and all(call["sample_seed"] == "ab" * 32 for call in calls)
    for honest, planted in zip(calls[::2], calls[1::2], strict=True):
        assert honest["row"] == planted["row"]
        assert (honest["quant_weights"] is None) == (planted["quant_weights"] is None)
