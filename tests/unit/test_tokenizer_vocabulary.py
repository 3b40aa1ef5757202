"""The vocabulary the tokenizer keys must hold, read from the tokenizer files as llama.cpp's converter reads
them (engine/gates/storage/tokenizer_metadata.py): its SentencePiece path (tokenizer.model, added tokens,
Phi-3's variant), tokenizer.json's BPE, WordPiece and Unigram vocabularies, and the XLM-R padding quirk.
The trained models' integration tests meet each path once on real files; these state each rule alone, on
files small enough to read in the test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.gates.storage.tokenizer_metadata import (
    BYTE,
    CONTROL,
    NORMAL,
    PHANTOM_SPACE,
    SENTENCEPIECE_FILE,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    TokenizerFiles,
    converter_notes,
    ggml_model,
    merges,
    sentencepiece_padding,
    special_ids,
    spm_vocabulary,
    tokenizer_expectations,
    unigram_scores,
    vocabulary,
)

PIECES = (("<unk>", UNKNOWN, 0.0), ("<s>", CONTROL, 0.0), ("▁a", NORMAL, -1.5), ("<0x41>", BYTE, 0.0))


def files(tokenizer: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
          model_config: dict[str, Any] | None = None, **more: Any) -> TokenizerFiles:
    return TokenizerFiles(tokenizer or {}, config or {}, model_config or {}, None, **more)


def expectation(found: TokenizerFiles, key: str) -> Any:
    return next(e for e in tokenizer_expectations(found) if e.key == key)


# --- the SentencePiece path ------------------------------------------------------------------------------------

def test_the_pieces_are_padded_to_vocab_size_as_unused_with_the_converters_score():
    spm = spm_vocabulary(files(model_config={"vocab_size": 6}), PIECES)
    assert spm.tokens == ["<unk>", "<s>", "▁a", "<0x41>", "[PAD4]", "[PAD5]"]
    assert spm.kinds == [UNKNOWN, CONTROL, NORMAL, BYTE, UNUSED, UNUSED]
    assert spm.scores == [0.0, 0.0, -1.5, 0.0, -10000.0, -10000.0]


def test_without_a_vocab_size_the_pieces_are_the_vocabulary_and_beyond_it_they_are_cut():
    assert spm_vocabulary(files(), PIECES).tokens == ["<unk>", "<s>", "▁a", "<0x41>"]
    assert spm_vocabulary(files(model_config={"vocab_size": 2}), PIECES).tokens == ["<unk>", "<s>"]


def test_added_tokens_json_entries_are_user_defined_and_score_minus_1000():
    found = files(model_config={"vocab_size": 6}, added_tokens_file={"<extra>": 4, "<far>": 6, "<neg>": -1, "x": "5"})
    spm = spm_vocabulary(found, PIECES)
    assert (spm.tokens[4], spm.kinds[4], spm.scores[4]) == ("<extra>", USER_DEFINED, -1000.0)
    assert (spm.tokens[5], spm.kinds[5], spm.scores[5]) == ("[PAD5]", UNUSED, -10000.0)  # a str id is no id


def test_added_tokens_decoder_entries_are_control_when_special_or_special_looking():
    decoder = {"4": {"content": "<|im_end|>", "special": False}, "5": {"content": "▁plain", "special": False},
               "1": {"content": "<custom>", "special": True}, "9": {"content": "<far>"}, "x": {"content": "<x>"},
               "2": {"content": 7}, "3": "not a dict"}
    spm = spm_vocabulary(files(config={"added_tokens_decoder": decoder}, model_config={"vocab_size": 6}), PIECES)
    assert spm.tokens == ["<unk>", "<custom>", "▁a", "<0x41>", "<|im_end|>", " plain"]
    assert spm.kinds == [UNKNOWN, CONTROL, NORMAL, BYTE, CONTROL, USER_DEFINED]
    assert spm.scores == [0.0, -1000.0, -1.5, 0.0, -1000.0, -1000.0]


@pytest.mark.parametrize("token", ["<pad>", "<mask>", "<2mass>", "[@BOS@]", "<|x|>", "<｜x｜>", "<unused7>"])
def test_the_converters_special_looking_tokens(token):
    decoder = {"2": {"content": token, "special": False}}
    assert spm_vocabulary(files(config={"added_tokens_decoder": decoder}), PIECES).kinds[2] == CONTROL


@pytest.mark.parametrize("token", ["<b>", "[PAD]", "<|x", "unused>"])
def test_a_token_the_converter_does_not_take_for_special(token):
    decoder = {"2": {"content": token, "special": False}}
    assert spm_vocabulary(files(config={"added_tokens_decoder": decoder}), PIECES).kinds[2] == USER_DEFINED


def test_phi3_keeps_phantom_spaces_judges_by_the_special_flag_and_takes_tokenizer_json_added_tokens_last():
    decoder = {"2": {"content": "▁x", "special": False}, "3": {"content": "<|end|>", "special": False}}
    added = [{"id": 3, "content": "<|endoftext|>", "special": True}, {"id": 1, "content": "<b>", "special": False},
             {"id": 8, "content": "<far>", "special": True}]
    found = files({"added_tokens": added}, {"added_tokens_decoder": decoder}, {"architectures": ["Phi3ForCausalLM"]})
    spm = spm_vocabulary(found, PIECES)
    assert spm.tokens == ["<unk>", "<b>", "▁x", "<|endoftext|>"]
    assert spm.kinds == [UNKNOWN, USER_DEFINED, USER_DEFINED, CONTROL]
    assert spm.scores == [0.0, -1000.0, -1000.0, -1000.0]
    other = spm_vocabulary(files({"added_tokens": added}, {"added_tokens_decoder": decoder}), PIECES)
    assert other.tokens == ["<unk>", "<s>", " x", "<|end|>"]  # not Phi-3: tokenizer.json's are not read here


def test_a_llama_vocabulary_with_a_tokenizer_model_is_the_sentencepiece_one_with_its_scores():
    found = files({"model": {"type": "BPE", "byte_fallback": True, "vocab": {"ignored": 0}}}, spm_pieces=PIECES)
    assert vocabulary(found, "llama") == (["<unk>", "<s>", "▁a", "<0x41>"], [UNKNOWN, CONTROL, NORMAL, BYTE])
    assert expectation(found, "tokenizer.ggml.scores").expected == [0.0, 0.0, -1.5, 0.0]
    assert expectation(found, "tokenizer.ggml.tokens").expected == ["<unk>", "<s>", "▁a", "<0x41>"]


# --- tokenizer.json's vocabularies -----------------------------------------------------------------------------

def test_a_byte_fallback_bpe_vocabulary_knows_its_unknown_and_byte_tokens():
    found = files({"model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>",
                             "vocab": {"<unk>": 0, "<0x0A>": 1, "<0x0>": 2, "a": 3}}}, model_config={"vocab_size": 5})
    assert ggml_model(found) == "llama"
    assert vocabulary(found, "llama") == (["<unk>", "<0x0A>", "<0x0>", "a", "[PAD4]"],
                                          [UNKNOWN, BYTE, NORMAL, NORMAL, UNUSED])


def test_added_tokens_are_control_when_special_or_special_looking_else_user_defined():
    added = [{"id": 2, "content": "<|eot|>", "special": False}, {"id": 3, "content": "<b c>", "special": False},
             {"id": 4, "content": "plain", "special": True}, {"id": 5, "content": "<é>", "special": False}]
    found = files({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}, "added_tokens": added})
    assert ggml_model(found) == "gpt2"
    tokens, kinds = vocabulary(found, "gpt2")
    assert tokens == ["a", "b", "<|eot|>", "<b c>", "plain", "<é>"]
    assert kinds == [NORMAL, NORMAL, CONTROL, USER_DEFINED, CONTROL, USER_DEFINED]


def test_a_vocabulary_larger_than_vocab_size_is_kept_whole():
    found = files({"model": {"type": "BPE", "vocab": {"a": 0, "b": 3}}}, model_config={"vocab_size": 2})
    assert vocabulary(found, "gpt2") == (["a", "[PAD1]", "[PAD2]", "b"], [NORMAL, UNUSED, UNUSED, NORMAL])


def test_an_empty_vocabulary_is_empty():
    assert vocabulary(files({"model": {"type": "BPE"}}), "gpt2") == ([], [])


def test_wordpiece_writes_continuations_bare_and_word_starts_with_a_phantom_space_but_not_control_tokens():
    added = [{"id": 0, "content": "[CLS]", "special": True}]
    found = files({"model": {"type": "WordPiece", "vocab": {"[CLS]": 0, "##ing": 1, "run": 2}}, "added_tokens": added})
    assert ggml_model(found) == "bert"
    assert vocabulary(found, "bert") == (["[CLS]", "ing", PHANTOM_SPACE + "run"], [CONTROL, NORMAL, NORMAL])
    assert expectation(found, "tokenizer.ggml.token_type_count").expected == 1


def test_a_unigram_vocabulary_marks_its_unknown_piece_even_among_the_added_tokens_and_keeps_float32_scores():
    vocab = [["<pad>", 0.0], ["<unk>", 0.0], ["▁a", -1.1], ["b", -2.5]]
    added = [{"id": 0, "content": "<pad>", "special": True}, {"id": 1, "content": "<unk>", "special": True}]
    found = files({"model": {"type": "Unigram", "vocab": vocab, "unk_token": "<unk>"}, "added_tokens": added},
                  model_config={"vocab_size": 5})
    assert ggml_model(found) == "t5"
    assert special_ids(found) == {"unk": 1}
    assert vocabulary(found, "t5") == (["<pad>", "<unk>", "▁a", "b", "[PAD4]"],
                                       [CONTROL, UNKNOWN, NORMAL, NORMAL, UNUSED])
    scores = unigram_scores(found, 5)
    assert scores == [0.0, 0.0, float(np.float32(-1.1)), -2.5, -10000.0]
    assert scores[2] != -1.1  # rounded to float32 as GGUF stores it
    assert expectation(found, "tokenizer.ggml.scores").expected == scores


@pytest.mark.parametrize(("raw", "stored"), [
    (["a b", "ab c"], ["a b", "ab c"]),
    ([["a", "b"], ["a b", "c"]], ["a b", "a\u0120b c"]),
    ([], None), (None, None), ("a b", None)])
def test_merges_as_gguf_stores_them(raw, stored):
    assert merges(files({"model": {"type": "BPE", "merges": raw}})) == stored


# --- the XLM-R quirk -------------------------------------------------------------------------------------------

XLMR_VOCAB = [["<s>", 0.0], ["<pad>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["▁a", -1.0], ["<mask>", 0.0]]


def xlmr(vocab: list[list[Any]] | None = None, *, architecture: str = "XLMRobertaModel", mask: str = "<mask>",
         sentencepiece_model: bool = True, vocab_size: int = 7) -> TokenizerFiles:
    added = [{"id": i, "content": piece, "special": True} for i, (piece, _) in enumerate(vocab or XLMR_VOCAB)
             if piece.startswith("<") and piece != "▁a"]
    return files({"model": {"type": "Unigram", "vocab": vocab or XLMR_VOCAB, "unk_token": "<unk>"},
                  "added_tokens": added}, {"mask_token": mask},
                 {"architectures": [architecture], "vocab_size": vocab_size}, sentencepiece_model=sentencepiece_model)


def test_an_xlmr_vocabulary_read_from_its_sentencepiece_file_expects_the_mask_and_beyond_as_padding():
    found = xlmr()
    assert sentencepiece_padding(found) == 5
    tokens = expectation(found, "tokenizer.ggml.tokens")
    assert tokens.expected == ["<s>", "<pad>", "</s>", "<unk>", "▁a", "[PAD4]", "[PAD5]"]
    assert tokens.origin.endswith(f"; from id 5 on as the converter's {SENTENCEPIECE_FILE} path stores them "
                                  "([PAD<id - 1>])")
    assert expectation(found, "tokenizer.ggml.token_type").expected[4:] == [NORMAL, UNUSED, UNUSED]
    assert expectation(found, "tokenizer.ggml.scores").expected[4:] == [-1.0, -10000.0, -10000.0]
    (note,) = converter_notes(found)
    assert note.startswith("tokenizer: <mask> (id 5) is expected as [PAD4] (unused, score -10000)")
    assert SENTENCEPIECE_FILE in note


@pytest.mark.parametrize("changed", [
    {"sentencepiece_model": False}, {"architecture": "BertModel"}, {"mask": "<unk>"},
    {"vocab": [["<pad>", 0.0], ["<s>", 0.0], ["</s>", 0.0], ["<unk>", 0.0], ["▁a", -1.0], ["<mask>", 0.0]]},
    {"vocab": [*XLMR_VOCAB[:5], ["<extra>", 0.0]]}, {"vocab": XLMR_VOCAB[:4]}])
def test_any_other_layout_is_compared_with_tokenizer_json_as_it_is(changed):
    found = xlmr(**changed)
    assert sentencepiece_padding(found) is None
    assert converter_notes(found) == []
    assert "[PAD<id - 1>]" not in expectation(found, "tokenizer.ggml.tokens").origin


def test_the_quirk_needs_a_unigram_list_vocabulary():
    found = files({"model": {"type": "BPE", "vocab": {"<s>": 0}}}, sentencepiece_model=True,
                  model_config={"architectures": ["XLMRobertaModel"]})
    assert sentencepiece_padding(found) is None
