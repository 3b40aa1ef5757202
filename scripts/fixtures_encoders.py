"""Encoder fixtures for issue 11: tiny random-weight XLM-RoBERTa models (an embedding model and a
reranker) with the real XLM-R SentencePiece-Unigram vocabulary, converted by the llama.cpp
sdist's own converter and quantized by its quantizer.

transformers cannot rebuild a tokenizer from `ggml-vocab-nomic-bert-moe.gguf` (it refuses the
`nomic-bert-moe` architecture), so the XLM-R tokenizer is built with the `tokenizers` library
from that file's pieces, scores and precompiled character map, in the form XLM-R tokenizer.json
files have (a Precompiled normalizer, a Metaspace pre-tokenizer, the `<s> A </s> </s> B </s>`
template). There is no sentencepiece.bpe.model, so the converter takes its tokenizer.json path
(as for jina-embeddings-v3), which reads the space prefix from `add_prefix_space` (saved as True,
what the Metaspace pre-tokenizer does). Each folder holds `source/`, `F16.gguf` and `Q8_0.gguf`; the
Q8_0 is quantized from an F32 conversion (removed afterwards), as the source is F32. A variant,
arch-xlm-roberta-spm, adds the `sentencepiece.bpe.model` real XLM-R models ship (written from the same
pieces), so the converter takes its SentencePiece path (F16 only).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fixture_tools import convert, llama_cpp_tree, produce, quantize, sentence_transformers_modules

XLMR_VOCAB_FILE = "ggml-vocab-nomic-bert-moe.gguf"
XLMR_VOCAB_SIZE = 250002  # XLM-R's <s> <pad> </s> <unk> ... <mask>; the GGUF pads to 250048
TINY_XLMR_CONFIG = {
    "vocab_size": XLMR_VOCAB_SIZE, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "max_position_embeddings": 514, "type_vocab_size": 1, "pad_token_id": 1,
    "bos_token_id": 0, "eos_token_id": 2, "layer_norm_eps": 1e-5,
}


def _xlmr_tokenizer(tree: Path, tmp: Path) -> None:
    """XLM-R's Unigram tokenizer from the GGUF vocabulary, saved as an XLMRobertaTokenizerFast."""
    import base64

    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import XLMRobertaTokenizerFast

    reader = gguf.GGUFReader(tree / "models" / XLMR_VOCAB_FILE)
    pieces = reader.fields["tokenizer.ggml.tokens"].contents()[:XLMR_VOCAB_SIZE]
    scores = reader.fields["tokenizer.ggml.scores"].contents()[:XLMR_VOCAB_SIZE]
    charsmap = bytes(reader.fields["tokenizer.ggml.precompiled_charsmap"].contents())
    pieces[XLMR_VOCAB_SIZE - 1] = "<mask>"  # the vocabulary file pads past <mask>; XLM-R ends with it
    backend = Tokenizer(models.Unigram([(p, float(s)) for p, s in zip(pieces, scores, strict=True)], unk_id=3))
    backend.normalizer = normalizers.Precompiled(charsmap)
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = XLMRobertaTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token=AddedToken("<mask>", lstrip=True, special=True),
        model_max_length=512, add_prefix_space=True)
    tokenizer.save_pretrained(tmp)
    data = json.loads((tmp / "tokenizer.json").read_text(encoding="utf-8"))
    assert base64.b64decode(data["normalizer"]["precompiled_charsmap"]) == charsmap
    (tmp / "sentencepiece.bpe.model").unlink(missing_ok=True)


def _sentence_transformers_mean(root: Path, dim: int) -> None:
    """multilingual-e5's sentence-transformers files: mean pooling, then Normalize."""
    sentence_transformers_modules(root, dim, {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
                                              "pooling_mode_max_tokens": False, "pooling_mode_lasttoken": False})
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))


def _convert_and_quantize(tree: Path, source: Path, out: Path) -> None:
    convert(tree, source, "f16", out / "F16.gguf")
    if not (out / "Q8_0.gguf").exists():
        f32 = convert(tree, source, "f32", out / "F32.gguf")
        quantize(f32, "Q8_0", out / "Q8_0.gguf")
        f32.unlink()


def _tokenizer(cache: Path, tree: Path) -> Path:
    return produce(cache / "xlm-r-tokenizer", lambda tmp: _xlmr_tokenizer(tree, tmp))


def _build_xlmr(cache: Path, folder: str, make_model: Callable[[Path], None]) -> None:
    """A tiny XLM-RoBERTa-family model with the rebuilt XLM-R tokenizer, converted to F16 and Q8_0."""
    tree = llama_cpp_tree(cache)
    tokenizer = _tokenizer(cache, tree)
    out = cache / folder
    out.mkdir(exist_ok=True)

    def make_source(tmp: Path) -> None:
        shutil.copytree(tokenizer, tmp)
        make_model(tmp)

    _convert_and_quantize(tree, produce(out / "source", make_source), out)


def build_xlm_roberta(cache: Path) -> None:
    """A multilingual-e5-shaped embedding model: XLMRobertaModel, mean pooling, normalised (GGUF arch
    `bert`). (With CLS pooling a random-weight model's embeddings are near-ties for retrieval.)"""

    def make_model(tmp: Path) -> None:
        import torch
        from transformers import XLMRobertaConfig, XLMRobertaModel

        torch.manual_seed(11)
        config = XLMRobertaConfig(architectures=["XLMRobertaModel"], **TINY_XLMR_CONFIG)
        XLMRobertaModel(config).save_pretrained(tmp, safe_serialization=True)
        _sentence_transformers_mean(tmp, int(TINY_XLMR_CONFIG["hidden_size"]))

    _build_xlmr(cache, "arch-xlm-roberta", make_model)


def build_bge_reranker(cache: Path) -> None:
    """A bge-reranker-shaped cross-encoder: XLMRobertaForSequenceClassification with one label,
    no sentence-transformers files (GGUF arch `bert`, classifier head as cls / cls.output)."""

    def make_model(tmp: Path) -> None:
        import torch
        from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

        torch.manual_seed(12)
        # initializer_range 0.2 (not 0.02): sharper random attention makes the <s> state depend on the
        # input, so scores spread over the documents as a trained reranker's do instead of near-ties
        config = XLMRobertaConfig(architectures=["XLMRobertaForSequenceClassification"], num_labels=1,
                                  initializer_range=0.2, **TINY_XLMR_CONFIG)
        XLMRobertaForSequenceClassification(config).save_pretrained(tmp, safe_serialization=True)

    _build_xlmr(cache, "arch-bge-reranker", make_model)


def _sentencepiece_model(tokenizer_json: Path, target: Path) -> None:
    """The `sentencepiece.bpe.model` real XLM-R models ship, written from the tokenizer's own pieces: a
    Unigram ModelProto in fairseq's order (<unk> <s> </s> first, every other HF id one lower, no <pad> and
    no <mask>: HF's XLM-R tokenizer adds those around it). Its normaliser is the tokenizer's (precompiled
    map, dummy prefix, no whitespace collapsing: the fixture's tokenizer.json has no Replace normaliser)."""
    import base64

    from sentencepiece import sentencepiece_model_pb2  # the converter reads it with the same classes

    spm: Any = sentencepiece_model_pb2  # generated protobuf classes, no type stubs

    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    assert [p for p, _ in vocab[:4]] == ["<s>", "<pad>", "</s>", "<unk>"] and vocab[-1][0] == "<mask>"
    proto = spm.ModelProto()
    kinds = spm.ModelProto.SentencePiece
    for piece, kind in (("<unk>", kinds.UNKNOWN), ("<s>", kinds.CONTROL), ("</s>", kinds.CONTROL)):
        proto.pieces.add(piece=piece, score=0.0, type=kind)
    for piece, score in vocab[4:-1]:
        proto.pieces.add(piece=piece, score=score, type=kinds.NORMAL)
    proto.trainer_spec.model_type = spm.TrainerSpec.UNIGRAM
    proto.trainer_spec.vocab_size = len(proto.pieces)
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 0, 1, 2
    proto.trainer_spec.pad_id = -1
    proto.normalizer_spec.name = "nmt_nfkc"
    proto.normalizer_spec.precompiled_charsmap = base64.b64decode(data["normalizer"]["precompiled_charsmap"])
    proto.normalizer_spec.add_dummy_prefix = True
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    target.write_bytes(proto.SerializeToString())


def build_xlm_roberta_spm(cache: Path) -> None:
    """arch-xlm-roberta's model with a `sentencepiece.bpe.model` beside its tokenizer.json, as bge-m3 and
    multilingual-e5 ship: the converter then reads the vocabulary from the SentencePiece file (F16 only)."""
    build_xlm_roberta(cache)
    tree = llama_cpp_tree(cache)
    plain = cache / "arch-xlm-roberta" / "source"
    out = cache / "arch-xlm-roberta-spm"
    out.mkdir(exist_ok=True)

    def make_source(tmp: Path) -> None:
        shutil.copytree(plain, tmp)
        _sentencepiece_model(tmp / "tokenizer.json", tmp / "sentencepiece.bpe.model")

    convert(tree, produce(out / "source", make_source), "f16", out / "F16.gguf")


BUILDERS = {"arch-xlm-roberta": build_xlm_roberta, "arch-bge-reranker": build_bge_reranker,
            "arch-xlm-roberta-spm": build_xlm_roberta_spm}
