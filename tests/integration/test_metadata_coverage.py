"""Every GGUF key is accounted for: compared with the source, named as not derivable, or a blocker.

The key lists come from sources that cannot silently miss one: the keys llama.cpp's own converter
wrote into each fixture (observed, not typed in here), and gguf-py's key table (`gguf.Keys`, the
Python mirror of the loader's LLM_KV names), every entry of which is planted into an honest file
to show it can never pass unnoticed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import pytest

from engine.formats.gguf_structure import read_layout
from engine.formats.source import open_source
from engine.gates.architectures import architecture_for
from engine.gates.storage.metadata_check import check_metadata
from engine.gates.storage.metadata_keys import DESCRIPTIVE

pytestmark = pytest.mark.slow

# name -> (session fixture, or "fixture:member" of a dict fixture; the converted file in it). The first three
# are named by their GGUF architecture for the tests below that edit one key of them.
FIXTURES = {
    "bert": ("minilm", "minilm-F16.gguf"),
    "llama": ("tiny_llama", "tiny-llama-F32.gguf"),
    "qwen3": ("qwen3", "tiny-qwen3-F32.gguf"),
    **{f"arch-{name}": (f"decoders:{name}", "F16.gguf")
       for name in ("llama", "mistral", "qwen2", "qwen3moe", "gemma2", "gemma3", "phi3")},
    "arch-xlm-roberta": ("xlm_roberta", "F16.gguf"),
    "arch-bge-reranker": ("bge_reranker", "F16.gguf"),
    "arch-xlm-roberta-spm": ("xlm_roberta_spm", "F16.gguf"),
}


def _converted(request: pytest.FixtureRequest, name: str) -> tuple[Path, Path]:
    """(fixture folder, converted file) of one FIXTURES entry."""
    fixture, file = FIXTURES[name]
    fixture, _, member = fixture.partition(":")
    root = request.getfixturevalue(fixture)
    root = Path(root[member] if member else root)
    return root, root / file


def _outcome(request: pytest.FixtureRequest, name: str, metadata_edit=None):
    root, converted = _converted(request, name)
    layout = read_layout(converted)
    if metadata_edit is not None:
        layout = dataclasses.replace(layout, metadata=metadata_edit(dict(layout.metadata)))
    source = open_source(root / "source")
    arch = read_layout(converted).metadata["general.architecture"]
    return layout, check_metadata(architecture_for(arch, source.config), layout, source)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_key_the_converter_wrote_is_compared_or_named(name: str, request: pytest.FixtureRequest) -> None:
    layout, outcome = _outcome(request, name)
    arch = layout.metadata["general.architecture"]
    assert outcome.blockers == []
    named = " ".join(outcome.not_verified)
    unaccounted = [key for key in layout.metadata
                   if key not in outcome.compared and key not in named and not DESCRIPTIVE.fullmatch(key)
                   and not key.startswith("tokenizer.ggml.add_") and key != "general.alignment"]
    assert unaccounted == []
    # the hyperparameters that move logits are compared, not merely listed
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count"):
        assert f"{arch}.{key}" in outcome.compared


def _loader_keys(arch: str) -> set[str]:
    keys = set()
    for group in vars(gguf.Keys).values():
        if isinstance(group, type):
            for value in vars(group).values():
                if isinstance(value, str) and "." in value and "{" not in value.replace("{arch}", ""):
                    keys.add(value.format(arch=arch))
    # general.alignment is the parser's (a planted value never reaches the metadata check unparsed)
    return {key for key in keys if not DESCRIPTIVE.fullmatch(key) and key != "general.alignment"}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_no_loader_key_can_be_planted_silently(name: str, request: pytest.FixtureRequest) -> None:
    """Each key of the loader's table, set to a value the honest file does not hold, is a blocker or named.

    All keys are planted into one copy: each key's verdict is its own (a blocker or a not_verified line
    naming it), so one run answers for every key."""
    universe = _loader_keys(read_layout(_converted(request, name)[1]).metadata["general.architecture"])
    assert len(universe) > 150

    def plant(metadata):
        for key in universe:
            current = metadata.get(key)
            if isinstance(current, bool):
                metadata[key] = not current
            else:
                metadata[key] = current + 7 if isinstance(current, int) else 12345
        return metadata

    _, outcome = _outcome(request, name, plant)
    named = " ".join(outcome.not_verified)
    blocked = {b.key for b in outcome.blockers}
    silent = sorted(key for key in universe if key not in blocked and key not in named)
    assert silent == []


@pytest.mark.parametrize(("arch", "key", "value"), [
    ("llama", "llama.rope.freq_base", 20000.0),
    ("llama", "llama.attention.layer_norm_rms_epsilon", 1e-6),
    ("llama", "llama.rope.dimension_count", 32),
    ("llama", "llama.attention.key_length", 32),
    ("llama", "llama.vocab_size", 32001),
    ("qwen3", "qwen3.attention.head_count_kv", 4),
    ("qwen3", "qwen3.context_length", 1024),
    ("bert", "bert.attention.causal", True),
    ("bert", "tokenizer.ggml.token_type_count", 1),
    ("bert", "tokenizer.ggml.normalizer.lowercase", False),
    ("bert", "general.architecture", "nomic-bert"),
])
def test_a_changed_runtime_key_is_named(arch: str, key: str, value, request: pytest.FixtureRequest) -> None:
    _, outcome = _outcome(request, arch, lambda m: {**m, key: value})
    assert key in {b.key for b in outcome.blockers}


def test_a_key_absent_where_llama_cpp_defaults_differently_is_missing(request: pytest.FixtureRequest) -> None:
    """bert.attention.causal defaults to true in llama.cpp: leaving it out makes BERT causal."""
    _, outcome = _outcome(request, "bert", lambda m: {k: v for k, v in m.items() if k != "bert.attention.causal"})
    assert [(b.code, b.key) for b in outcome.blockers] == [("metadata.missing", "bert.attention.causal")]


def test_a_changed_token_is_named_with_its_index(request: pytest.FixtureRequest) -> None:
    def swap(metadata):
        tokens = list(metadata["tokenizer.ggml.tokens"].values)
        tokens[2000], tokens[2001] = tokens[2001], tokens[2000]
        return {**metadata, "tokenizer.ggml.tokens": tokens}

    _, outcome = _outcome(request, "qwen3", swap)
    (blocker,) = [b for b in outcome.blockers if b.key == "tokenizer.ggml.tokens"]
    assert "2 of 151936 entries differ" in blocker.why and "[2000]" in blocker.why


@pytest.mark.parametrize(("arch", "flag", "value"), [
    ("bert", "tokenizer.ggml.add_eos_token", False),  # llama.cpp's WordPiece path ignores it; others read it
    ("bert", "tokenizer.ggml.add_bos_token", False),
    ("bert", "tokenizer.ggml.add_sep_token", True),
    ("qwen3", "tokenizer.ggml.add_eos_token", False),
    ("qwen3", "tokenizer.ggml.add_bos_token", True),
    ("llama", "tokenizer.ggml.add_bos_token", False),
    ("llama", "tokenizer.ggml.add_eos_token", True),
])
def test_special_token_flags_are_judged_by_meaning(arch: str, flag: str, value: bool,
                                                   request: pytest.FixtureRequest) -> None:
    _, outcome = _outcome(request, arch, lambda m: {**m, flag: value})
    flagged = [b for b in outcome.blockers if b.code == "tokenizer.flag_mismatch"]
    assert [b.key for b in flagged] == [flag]
    assert "Hugging Face" in flagged[0].why


def test_an_absent_flag_is_read_as_llama_cpp_default(request: pytest.FixtureRequest) -> None:
    """Without add_eos_token, a gpt2 vocabulary appends nothing, but Qwen3-Embedding's template appends EOS."""
    _, outcome = _outcome(request, "qwen3",
                          lambda m: {k: v for k, v in m.items() if k != "tokenizer.ggml.add_eos_token"})
    (blocker,) = outcome.blockers
    assert blocker.key == "tokenizer.ggml.add_eos_token" and "default" in blocker.why


def test_the_flag_must_add_the_template_token(request: pytest.FixtureRequest) -> None:
    _, outcome = _outcome(request, "qwen3", lambda m: {**m, "tokenizer.ggml.eos_token_id": 151645})
    assert {b.key for b in outcome.blockers} == {"tokenizer.ggml.eos_token_id"}
    assert {b.code for b in outcome.blockers} == {"metadata.mismatch", "tokenizer.flag_mismatch"}


def test_fixture_paths_exist(request: pytest.FixtureRequest) -> None:
    for name in FIXTURES:
        assert _converted(request, name)[1].is_file()
