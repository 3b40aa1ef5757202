"""Encoder architectures llama.cpp converts as `bert`: honest F16 and Q8_0 conversions by llama.cpp's
own converter and quantizer are GO through gates 1 and 2, and a single-defect twin of each is NO-GO
naming the tensor or key. An architecture convgate does not map is never GO and never a crash."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from engine.formats.gguf_structure import read_layout
from engine.policy import Policy
from engine.quality_budgets import QualityBudget
from engine.quant.precision import PRECISION_CLASSES
from engine.report import Report
from tests.conftest import blocked_tensors, codes, defect_copy, run_gates
from tests.gguf_rewrite import rewrite

pytestmark = pytest.mark.slow
XLMR = "bert (XLM-RoBERTa)"
POSITIONS = "embeddings.position_embeddings.weight"


def honest_reports(root: Path) -> dict[str, Report]:
    """One all-gates report per honest conversion (F16, Q8_0) of a fixture folder, shared by a module."""
    return {t: run_gates(root / "source", root / f"{t}.gguf", {1, 2, 3}) for t in ("F16", "Q8_0")}


@pytest.fixture(scope="module")
def xlmr_reports(xlm_roberta: Path) -> dict[str, Report]:
    return honest_reports(xlm_roberta)


@pytest.mark.coverage(arch=XLMR, types=("F16", "Q8_0"), imatrix=False, proves="GO", gates="1,2,3")
@pytest.mark.parametrize("gguf_type", ["F16", "Q8_0"])
def test_xlm_roberta_honest_conversion_is_go(xlmr_reports: dict[str, Report], gguf_type: str) -> None:
    report = xlmr_reports[gguf_type]
    assert report.verdict == "GO", report.blockers
    storage = report.gates["storage"].details
    assert len(storage["tensors"]) == 37
    embeddings = report.gates["runtime"].details["embeddings"]
    assert embeddings["pooling"] == "mean" and embeddings["min_cosine"] > 0.999


def test_xlm_roberta_position_embeddings_are_a_stated_row_slice(xlmr_reports: dict[str, Report]) -> None:
    """The converter drops the first padding_idx + 1 rows (RoBERTa counts positions from there)."""
    inventory = xlmr_reports["F16"].gates["storage"].details["inventory"]
    assert inventory[POSITIONS].startswith("transformed (") and "[2:]" in inventory[POSITIONS]
    assert "position_embd.weight" in inventory[POSITIONS]
    context = next(c for c in xlmr_reports["F16"].gates["storage"].details["metadata"]
                   if c["key"] == "bert.context_length")
    assert context["expected"] == 512 and "padding" in context["origin"]


@pytest.mark.coverage(arch=XLMR, types=("F16",), imatrix=False, proves="NO-GO",
                      defect="position embeddings stored without the padding-offset slice")
def test_xlm_roberta_positions_without_the_slice_are_no_go(xlm_roberta: Path, tmp_path: Path) -> None:
    """The first 512 source rows instead of rows 2..513: the shape agrees, the values do not."""
    unsliced = load_file(xlm_roberta / "source" / "model.safetensors")[POSITIONS][:512]
    stored_as = np.float16 if read_layout(xlm_roberta / "F16.gguf").tensor("position_embd.weight").ggml_type.name == \
        "F16" else np.float32

    def store_unsliced(raw: np.ndarray) -> None:
        raw.view(stored_as)[:] = unsliced.astype(stored_as).reshape(-1)

    bad = defect_copy(xlm_roberta / "F16.gguf", tmp_path, "position_embd.weight", store_unsliced)
    report = run_gates(xlm_roberta / "source", bad, {1})
    assert report.verdict == "NO-GO"
    assert blocked_tensors(report, "tensor.value_mismatch") == {"position_embd.weight"}


CONVGATE = [sys.executable, "-m", "service", "verify"]


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CONVGATE, *map(str, args)], capture_output=True, text=True, timeout=600, check=False)


def test_an_unmapped_architecture_is_no_go_naming_it_and_its_tensors(xlm_roberta: Path, tmp_path: Path) -> None:
    """A GGUF of an architecture with no map, through gates 1 and 2 by the CLI: exit 1, NO-GO, no traceback."""
    artifact = rewrite(xlm_roberta / "F16.gguf", tmp_path / "unmapped.gguf",
                       set_keys={"general.architecture": "nomic-bert"})
    result = _cli("--source", xlm_roberta / "source", "--artifact", artifact, "--gates", "1,2",
                  "--report", tmp_path / "report.json")
    assert result.returncode == 1 and result.stdout.rstrip().splitlines()[-1] == "NO-GO"
    assert "Traceback" not in result.stdout + result.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    (blocker,) = [b for b in report["blockers"] if b["code"] == "metadata.unsupported_architecture"]
    assert "'nomic-bert'" in blocker["why"] and "37 tensors" in blocker["why"]
    names = [info.name for info in read_layout(artifact).tensors]
    assert report["gates"]["storage"]["details"]["unchecked_tensors"] == names
    assert "position_embd.weight" in blocker["why"]


def test_an_architecture_transformers_cannot_build_is_a_clear_blocker(xlm_roberta: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(xlm_roberta / "source", source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "model_type": "foobar",
                                                    "architectures": ["FooBarModel"]}))
    report = run_gates(source, xlm_roberta / "F16.gguf", {2})
    assert report.verdict == "NO-GO"
    (blocker,) = [b for b in report.blockers if b.code == "source.unsupported_architecture"]
    assert "FooBarModel" in blocker.why and "foobar" in blocker.why and "\n" not in blocker.why
    assert "verifier.reference_missing" not in codes(report)
    assert blocker.gate == "input"  # the source's defect, not the runtime's


def test_a_source_file_gate_2_cannot_read_is_an_input_blocker_like_an_unbuildable_one(xlm_roberta: Path,
                                                                                     tmp_path: Path) -> None:
    """Issue 35: gate 2 mapped a SourceError to gate "runtime" before llama.cpp loaded (a tokenizer.json
    `tokenizers` refuses) and to "input" after (an architecture transformers cannot build). One mapping now:
    a defect of the source is an input blocker wherever gate 2 meets it."""
    source = tmp_path / "source"
    shutil.copytree(xlm_roberta / "source", source)
    (source / "tokenizer.json").write_text('{"model": {"type": "NoSuchModel"}}')
    report = run_gates(source, xlm_roberta / "F16.gguf", {2})
    (blocker,) = [b for b in report.blockers if b.code == "source.bad_file"]
    assert blocker.gate == "input" and "tokenizer.json" in blocker.why


RERANKER = "bert (reranker, XLM-RoBERTa)"


@pytest.fixture(scope="module")
def reranker_reports(bge_reranker: Path) -> dict[str, Report]:
    return honest_reports(bge_reranker)


@pytest.mark.coverage(arch=RERANKER, types=("F16", "Q8_0"), imatrix=False, proves="GO", gates="1,2,3")
@pytest.mark.parametrize("gguf_type", ["F16", "Q8_0"])
def test_reranker_honest_conversion_is_go_on_relevance_scores(reranker_reports: dict[str, Report],
                                                              gguf_type: str) -> None:
    report = reranker_reports[gguf_type]
    assert report.verdict == "GO", report.blockers
    inventory = report.gates["storage"].details["inventory"]
    assert inventory["classifier.out_proj.weight"].startswith("renamed")
    assert inventory["classifier.dense.weight"].startswith("renamed")
    runtime = report.gates["runtime"].details
    assert runtime["kind"] == "reranker"
    relevance = runtime["relevance"]
    assert len(relevance["per_pair"]) == 12 and all(p["ids_equal"] for p in relevance["per_pair"])
    assert 0 < relevance["max_abs_diff"] <= relevance["threshold"]
    assert all(q["reference_order"] == q["candidate_order"] for q in relevance["per_query"])


@pytest.mark.coverage(arch=RERANKER, types=("F16",), imatrix=False, proves="NO-GO",
                      defect="reranker head output weight changed")
def test_a_changed_reranker_head_is_no_go_in_both_gates(bge_reranker: Path, tmp_path: Path) -> None:
    def negate(raw: np.ndarray) -> None:
        values = raw.view(np.float32) if raw.size == 64 * 4 else raw.view(np.float16)
        values[:] = -values

    bad = defect_copy(bge_reranker / "F16.gguf", tmp_path, "cls.output.weight", negate)
    budget = QualityBudget(min_cosine=0.99, retrieval_top1_equal=True, rerank_top1_equal=True)
    report = run_gates(bge_reranker / "source", bad, {1, 2}, Policy(quality=dict.fromkeys(PRECISION_CLASSES, budget)))
    assert report.verdict == "NO-GO"
    assert blocked_tensors(report, "tensor.value_mismatch") == {"cls.output.weight"}
    # gate 2: llama.cpp scores the negated head as transformers does (correct), and ranks unlike the source,
    # which a policy that budgets a reranker's best documents refuses (the default reports it)
    assert "quality.top1_differs_from_source" in codes(report), codes(report)
    assert not {"rerank.score_above_threshold", "rerank.order_mismatch"} & codes(report)
    assert not all(row["top1_equal"] for row in report.gates["runtime"].details["relevance"]["source_gap"])


@pytest.mark.coverage(arch=RERANKER, types=("F16",), imatrix=False, proves="NO-GO",
                      defect="no separator between query and document (add_sep_token false)")
def test_a_pair_without_its_separator_is_no_go_naming_the_pair(bge_reranker: Path, tmp_path: Path) -> None:
    bad = rewrite(bge_reranker / "F16.gguf", tmp_path / "no-sep.gguf",
                  set_keys={"tokenizer.ggml.add_sep_token": False})
    report = run_gates(bge_reranker / "source", bad, {1, 2})
    assert report.verdict == "NO-GO"
    assert "tokenizer.ggml.add_sep_token" in {b.key for b in report.blockers if b.code == "tokenizer.flag_mismatch"}
    assert "rerank.pair_mismatch" in codes(report)


@pytest.mark.coverage(arch=RERANKER, types=("F16",), imatrix=False, proves="GO", gates="1,2,3")
def test_reranker_honest_release_is_go_through_all_three_gates(bge_reranker: Path) -> None:
    """Gate 3 reloads the released file, re-scores gate 2's pairs and finds the same scores and order."""
    report = run_gates(bge_reranker / "source", bge_reranker / "F16.gguf", {1, 2, 3})
    assert report.verdict == "GO", report.blockers
    release = report.gates["release"]
    assert release.status == "passed"
    gate2 = report.gates["runtime"].details["relevance"]
    assert release.details["orders"] == [q["candidate_order"] for q in gate2["per_query"]]
    assert len(release.details["scores"]) == 3 and all(len(q) == 4 for q in release.details["scores"])
    assert release.details["max_abs_diff_from_gate2"] <= release.details["tolerance"]


MASK_QUIRK_ID = 250001  # XLM-R's <mask>, the last id: HF appends it, sentencepiece.bpe.model does not hold it


@pytest.mark.coverage(arch=XLMR, types=("F16",), imatrix=False, proves="GO")
def test_xlm_roberta_converted_from_its_sentencepiece_model_is_go_naming_the_mask_quirk(xlm_roberta_spm: Path) -> None:
    """bge-m3 / multilingual-e5 ship sentencepiece.bpe.model; the converter then reads the vocabulary from it
    and stores <mask> as `[PAD250000]` (unused, score -10000). That documented quirk is expected from the
    source's files and named in the report, never passed silently."""
    report = run_gates(xlm_roberta_spm / "source", xlm_roberta_spm / "F16.gguf", {1, 2})
    assert report.verdict == "GO", report.blockers
    stored = read_layout(xlm_roberta_spm / "F16.gguf").metadata["tokenizer.ggml.tokens"].values[MASK_QUIRK_ID]
    assert stored == "[PAD250000]"
    (note,) = [line for line in report.not_verified if "<mask>" in line]
    assert "sentencepiece.bpe.model" in note and "[PAD250000]" in note and str(MASK_QUIRK_ID) in note
    checks = {c["key"]: c for c in report.gates["storage"].details["metadata"]}
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        assert checks[key]["result"] == "ok" and "sentencepiece.bpe.model" in checks[key]["origin"]


def _with_token(src: Path, dst: Path, index: int, text: str) -> Path:
    tokens = list(read_layout(src).metadata["tokenizer.ggml.tokens"].values)
    tokens[index] = text
    return rewrite(src, dst, set_keys={"tokenizer.ggml.tokens": tokens})


@pytest.mark.coverage(arch=XLMR, types=("F16",), imatrix=False, proves="NO-GO", gates="1",
                      defect="<mask> stored as padding though the source has no sentencepiece.bpe.model")
def test_the_mask_quirk_without_a_sentencepiece_model_is_no_go(xlm_roberta: Path, tmp_path: Path) -> None:
    """The converter's tokenizer.json path keeps <mask>: the quirk is accepted only where the source makes it."""
    bad = _with_token(xlm_roberta / "F16.gguf", tmp_path / "padded-mask.gguf", MASK_QUIRK_ID, "[PAD250000]")
    report = run_gates(xlm_roberta / "source", bad, {1})
    assert report.verdict == "NO-GO"
    (blocker,) = [b for b in report.blockers if b.key == "tokenizer.ggml.tokens"]
    assert f"[{MASK_QUIRK_ID}]" in blocker.why and not [line for line in report.not_verified if "<mask>" in line]


@pytest.mark.coverage(arch=XLMR, types=("F16",), imatrix=False, proves="NO-GO", gates="1",
                      defect="another token changed in a SentencePiece-path conversion")
def test_a_changed_token_beside_the_mask_quirk_is_no_go(xlm_roberta_spm: Path, tmp_path: Path) -> None:
    bad = _with_token(xlm_roberta_spm / "F16.gguf", tmp_path / "changed.gguf", MASK_QUIRK_ID - 1, "hello")
    report = run_gates(xlm_roberta_spm / "source", bad, {1})
    assert report.verdict == "NO-GO"
    (blocker,) = [b for b in report.blockers if b.key == "tokenizer.ggml.tokens"]
    assert f"[{MASK_QUIRK_ID - 1}]" in blocker.why and "1 of 250002" in blocker.why
