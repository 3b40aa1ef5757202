"""The loader path fed hostile values: every file ends in a verdict, never in a verifier that died.

Twins of an honest tiny llama, each with one hostile metadata value of the kinds llama.cpp's loader has
mishandled (its 2025-26 advisories: special-token ids outside the vocabulary, GHSA-g4cc-763q-h9h6 and the
load() sibling fixed in #25508; counts the tensors contradict; a zero head count the graph divides by; a
token text far longer than any piece, the CVE-2025-49847 class; byte tokens a tokenizer indexes by their
text, the PLaMo-2 heap write of #25969; unknown names), plus the saved fuzz corpus. Gates 2 and 3 run each
through the llama.cpp child: what our own checks refuse never reaches the loader, what reaches it and
kills it is `runtime.crashed`, what it refuses is `runtime.load_failed`; all are NO-GO with a report.
Array element types and lengths (#26690, #20735) are refused earlier, by the structural parser
(`gguf.bad_tokenizer_array`), which tests/unit/test_gguf_structure.py covers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import codes, run_gates
from tests.gguf_rewrite import rewrite
from tests.mutation import gguf_edit

pytestmark = pytest.mark.slow
VERDICT_CODES = {"runtime.crashed", "runtime.load_failed", "runtime.refused_to_load"}
TEXTS = ("The quick brown fox jumps over the lazy dog.",)


def _with_tokens(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    gguf = gguf_edit.read(src)
    kvs = [kv if kv.key != "tokenizer.ggml.tokens" else type(kv)(kv.key, kv.vtype, edit(list(kv.value)),
                                                                   kv.element_type) for kv in gguf.kvs]
    return gguf_edit.write(gguf_edit.GGUFFile(gguf.version, kvs, gguf.tensors, gguf.alignment), dst)


HOSTILE = {
    "bos id past the vocabulary": {"tokenizer.ggml.bos_token_id": 10**6},
    "eos id at the vocabulary size": {"tokenizer.ggml.eos_token_id": 32000},
    "zero attention heads": {"llama.attention.head_count": 0},
    "zero key/value heads": {"llama.attention.head_count_kv": 0},
    "heads that do not divide the width": {"llama.attention.head_count": 7},
    "more blocks than the tensors": {"llama.block_count": 4096},
    "fewer blocks than the tensors": {"llama.block_count": 1},
    "a huge rope dimension": {"llama.rope.dimension_count": 1 << 30},
    "an unknown architecture": {"general.architecture": "not-an-architecture"},
    "an unknown tokenizer model": {"tokenizer.ggml.model": "no-such-tokenizer"},
    "a PLaMo-2 tokenizer over byte-token texts": {"tokenizer.ggml.model": "plamo2"},
    "expert counts on a dense model": {"llama.expert_count": 64, "llama.expert_used_count": 8},
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_value_is_a_no_go_with_a_report(tiny_llama, tmp_path, name):
    twin = rewrite(tiny_llama / "tiny-llama-F16.gguf", tmp_path / "twin.gguf", set_keys=HOSTILE[name])
    report = run_gates(tiny_llama / "source", twin, {2, 3}, texts=TEXTS)
    assert report.verdict == "NO-GO", (name, report.blockers)
    # refused by llama.cpp's child, by the check before loading, or already by the file's structure check
    assert {b.gate for b in report.blockers} & {"runtime", "storage"}, report.blockers


@pytest.mark.parametrize("edit", ["a token a million bytes long", "byte tokens named <0x-1>"])
def test_hostile_token_texts_are_a_no_go_with_a_report(tiny_llama, tmp_path, edit):
    def change(tokens: list[str]) -> list[str]:
        if edit.startswith("a token"):
            tokens[1000] = "x" * 1_000_000
        else:
            tokens[3:6] = ["<0x-1>", "<0x-f>", "<0xZZ>"]
        return tokens

    twin = _with_tokens(tiny_llama / "tiny-llama-F16.gguf", tmp_path / "twin.gguf", change)
    report = run_gates(tiny_llama / "source", twin, {2, 3}, texts=TEXTS)
    assert report.verdict in ("GO", "NO-GO")  # a verdict, whatever llama.cpp made of it
    assert not VERDICT_CODES & codes(report) or report.verdict == "NO-GO"


def test_the_saved_fuzz_corpus_reaches_a_verdict_on_the_loader_path(tiny_llama):
    corpus = sorted((Path(__file__).resolve().parents[2] / "fuzz" / "corpus" / "gguf_metadata").glob("*.gguf"))
    assert corpus
    for path in corpus:
        report = run_gates(tiny_llama / "source", path, {2, 3}, texts=TEXTS)
        assert report.verdict in ("GO", "NO-GO"), path
        assert report.verdict == "NO-GO" or path.name == "honest.gguf", (path.name, report.blockers)
