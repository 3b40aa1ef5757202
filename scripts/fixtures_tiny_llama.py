"""tiny-llama/: a small random llama with a real SentencePiece tokenizer, converted by llama.cpp's
converter; the imatrix fixtures quantize it again."""

from __future__ import annotations

from pathlib import Path

from fixture_tools import convert, llama_cpp_tree, produce, quantize
from fixtures_decoders import _write_sentencepiece

TINY_LLAMA_CONFIG = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}


def build_tiny_llama(cache: Path) -> None:
    """A small random llama (GQA: 4 heads, 2 KV heads) with a real tokenizer rebuilt offline from
    llama.cpp's ggml-vocab-llama-spm.gguf, converted by llama.cpp's converter (which permutes Q/K).

    It ships the `tokenizer.model` llama models ship, written from the same vocabulary: without one the
    converter takes its tokenizer.json path for llama, which writes every score as -1000, and llama.cpp's
    SentencePiece tokenizer then merges by position instead of by score ("Numbers" becomes "Num"+"bers"
    where transformers has "Number"+"s"): a real defect of that path, which the pre-tokenizer probe catches,
    not an honest fixture."""
    tree = llama_cpp_tree(cache)
    out = cache / "tiny-llama"
    out.mkdir(exist_ok=True)

    def make_source(tmp: Path) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(str(tree / "models"), gguf_file="ggml-vocab-llama-spm.gguf")
        tokenizer.eos_token = "</s>"  # the rebuild names <s> as EOS; llama's SentencePiece vocabulary ends with </s>
        tokenizer.save_pretrained(tmp)
        (tmp / "tokenizer.model").unlink(missing_ok=True)  # not a valid SentencePiece model when rebuilt
        _write_sentencepiece(tree / "models" / "ggml-vocab-llama-spm.gguf", tmp / "tokenizer.model", dummy_prefix=True)
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, **TINY_LLAMA_CONFIG)
        LlamaForCausalLM(config).save_pretrained(tmp, safe_serialization=True)

    source = produce(out / "source", make_source)
    convert(tree, source, "f32", out / "tiny-llama-F32.gguf")
    convert(tree, source, "f16", out / "tiny-llama-F16.gguf")
    for qtype in ("Q8_0", "Q4_K_M"):
        quantize(out / "tiny-llama-F32.gguf", qtype, out / f"tiny-llama-{qtype}.gguf")
