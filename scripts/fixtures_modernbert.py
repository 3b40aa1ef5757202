"""ModernBERT fixture for issue 11: a tiny random-weight ModernBertModel with ModernBERT's real
tokenizer, converted by the llama.cpp sdist's own converter (GGUF arch `modern-bert`) and quantized
by its quantizer.

ModernBERT's tokenizer is OLMo's GPT-NeoX byte-level BPE plus BERT-style specials. It is rebuilt
from `ggml-vocab-gpt-neox.gguf` (pieces and merges of ids 0..50276, the 23 whitespace-run pieces
kept as added tokens as in the GPT-NeoX tokenizer.json), then OLMo's three PII tokens, [UNK] [CLS]
[SEP] [PAD] [MASK] at 50280..50284 and [unused0..82] up to 50367, with the `[CLS] $A [SEP]`
template. The converter names the pre-tokenizer by hashing the token ids of its check text (with
the specials), and this tokenizer hashes to the value it lists for answerdotai/ModernBERT-base
(asserted below), so the GGUF carries `tokenizer.ggml.pre = modern-bert` as a real conversion does.
The folder holds `source/`, `F16.gguf` and `Q8_0.gguf` (quantized from an F32 conversion, removed
afterwards, as the source is F32).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from fixture_tools import convert, llama_cpp_tree, produce, quantize

NEOX_VOCAB_FILE = "ggml-vocab-gpt-neox.gguf"
NEOX_PIECES = 50277  # ids 0..50276: <|endoftext|>, <|padding|>, the BPE pieces, 23 whitespace runs
WHITESPACE_RUNS = range(50254, 50277)
MODERNBERT_VOCAB = 50368
# sha256 of str(token ids) of the converter's check text, listed in get_vocab_base_pre for ModernBERT-base
MODERNBERT_PRE_HASH = "a0b64b4385f123663873756336c085744376d015ff328bb1d901598f63c44152"
SPECIALS = {50277: "|||PHONE_NUMBER|||", 50278: "|||EMAIL_ADDRESS|||", 50279: "|||IP_ADDRESS|||",
            50280: "[UNK]", 50281: "[CLS]", 50282: "[SEP]", 50283: "[PAD]", 50284: "[MASK]"}
HIDDEN = 64
TINY_MODERNBERT_CONFIG: dict[str, Any] = {
    "vocab_size": MODERNBERT_VOCAB, "hidden_size": HIDDEN, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 512, "global_attn_every_n_layers": 3,
    "local_attention": 128, "pad_token_id": 50283, "bos_token_id": 50281, "eos_token_id": 50282,
    "cls_token_id": 50281, "sep_token_id": 50282, "hidden_activation": "gelu", "norm_eps": 1e-5,
    "layer_norm_eps": 1e-5,  # real ModernBERT configs carry both; the converter reads only this one
}


def _check_text(tree: Path) -> str:
    """The converter's own check text, read from its source rather than copied here."""
    import ast

    source = (tree / "conversion" / "base.py").read_text(encoding="utf-8")
    line = next(ln for ln in source.splitlines() if ln.strip().startswith("chktxt = "))
    return str(ast.literal_eval(line.split("=", 1)[1].strip()))


def _modernbert_tokenizer(tree: Path, tmp: Path) -> None:
    """ModernBERT's BPE tokenizer from the GPT-NeoX vocabulary, saved as a PreTrainedTokenizerFast."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    reader = gguf.GGUFReader(tree / "models" / NEOX_VOCAB_FILE)
    pieces = reader.fields["tokenizer.ggml.tokens"].contents()[:NEOX_PIECES]
    merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    backend = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=merges))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    special = {0: pieces[0], 1: pieces[1], **SPECIALS}
    special.update({i: f"[unused{i - 50285}]" for i in range(50285, MODERNBERT_VOCAB)})
    backend.add_special_tokens([AddedToken(special[i], special=True, normalized=False) for i in (0, 1)])
    backend.add_tokens([AddedToken(pieces[i], special=False, normalized=True) for i in WHITESPACE_RUNS])
    backend.add_special_tokens([AddedToken(special[i], special=True, normalized=False, lstrip=special[i] == "[MASK]")
                                for i in range(NEOX_PIECES, MODERNBERT_VOCAB)])
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 50281), ("[SEP]", 50282)])
    assert backend.get_vocab_size() == MODERNBERT_VOCAB and backend.token_to_id("[MASK]") == 50284
    ids = backend.encode(_check_text(tree)).ids
    assert hashlib.sha256(str(ids).encode()).hexdigest() == MODERNBERT_PRE_HASH, "not ModernBERT's pre-tokenizer"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]", model_max_length=512, model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=True)
    tokenizer.save_pretrained(tmp)


def build_modernbert(cache: Path) -> None:
    """A ModernBERT embedding model (ModernBertModel, mean pooling, normalised; GGUF arch `modern-bert`)."""
    from fixtures_encoders import _sentence_transformers_mean

    tree = llama_cpp_tree(cache)
    tokenizer = produce(cache / "modernbert-tokenizer", lambda tmp: _modernbert_tokenizer(tree, tmp))
    out = cache / "arch-modernbert"
    out.mkdir(exist_ok=True)

    def make_source(tmp: Path) -> None:
        import torch
        from transformers import ModernBertConfig, ModernBertModel

        shutil.copytree(tokenizer, tmp)
        torch.manual_seed(13)
        # initializer_range 0.2 (not 0.02): with 0.02 the layers barely move the residual stream, so
        # gate 2 could not tell a swapped q/k row or a wrong rope base from the honest file
        config = ModernBertConfig(architectures=["ModernBertModel"], initializer_range=0.2, **TINY_MODERNBERT_CONFIG)
        ModernBertModel(config).save_pretrained(tmp, safe_serialization=True)
        _sentence_transformers_mean(tmp, HIDDEN)

    source = produce(out / "source", make_source)
    convert(tree, source, "f16", out / "F16.gguf")
    if not (out / "Q8_0.gguf").exists():
        f32 = convert(tree, source, "f32", out / "F32.gguf")
        quantize(f32, "Q8_0", out / "Q8_0.gguf")
        f32.unlink()


BUILDERS = {"arch-modernbert": build_modernbert}
