"""What the verifier does with a GGUF key it does not derive from the source.

Every key in a GGUF is accounted for: derived and compared (architectures, hyperparameters,
tokenizer_metadata), judged by meaning (the add_* flags), verified by behaviour in gate 2, a
descriptive label, or named here as not derivable with the reason. Anything else is a blocker
(`metadata.unexpected_key`): a key llama.cpp may read whose value the source does not vouch for.
"""

from __future__ import annotations

import re

# Descriptive labels llama.cpp prints but never computes with.
DESCRIPTIVE = re.compile(
    r"general\.(type|name|author|version|organization|finetune|basename|description|quantized_by|size_label"
    r"|license(\.name|\.link)?|url|doi|uuid|repo_url|tags|languages"
    r"|source\.(url|doi|uuid|repo_url)|base_model\.(count|\d+\.\w+)|dataset\.(count|\d+\.\w+))"
)
CHECKED_ELSEWHERE: dict[str, str] = {
    "general.alignment": "checked by the structural parser (power of two, offsets aligned)",
    "tokenizer.ggml.add_bos_token": "judged by meaning against the HF template (tokenizer flags)",
    "tokenizer.ggml.add_eos_token": "judged by meaning against the HF template (tokenizer flags)",
    "tokenizer.ggml.add_sep_token": "judged by meaning against the HF pair template (tokenizer flags)",
}
# Keys a runtime reads that the source files do not determine; each is named under not_verified.
NOT_DERIVED: dict[str, str] = {
    "general.file_type": "a label for the dominant tensor type; every tensor's own type is checked instead",
    "general.quantization_version": "the ggml quantization format version; blocks are decoded and reproduced",
    "tokenizer.ggml.pre": "the converter names the pre-tokenizer from a hash table; gate 2 verifies it by "
                          "behaviour (token ids on every text, including a pre-tokenizer probe)",
    "tokenizer.ggml.scores": "BPE tokenizer.json holds merge ranks, not scores; gate 2 verifies tokenization "
                             "by behaviour",
    "tokenizer.ggml.add_space_prefix": "a SentencePiece option; gate 2 verifies it by behaviour",
    "tokenizer.ggml.remove_extra_whitespaces": "a SentencePiece option; gate 2 verifies it by behaviour",
    "tokenizer.ggml.precompiled_charsmap": "a SentencePiece normaliser blob; gate 2 verifies it by behaviour",
} | {f"quantize.imatrix.{label}": "llama-quantize's note of the importance matrix it used (no runtime reads it); "
     "the imatrix given to the verifier is named by its sha256 in gate 1" for label in
     ("file", "dataset", "entries_count", "chunks_count")}
# llama.cpp reads the pre-tokenizer name only for BPE vocabularies (llama-vocab.cpp): for these tokenizer
# models the key changes nothing a runtime computes.
NOT_READ_FOR_MODEL: dict[str, tuple[str, ...]] = {
    "bert": ("tokenizer.ggml.pre",), "llama": ("tokenizer.ggml.pre",), "t5": ("tokenizer.ggml.pre",),
}
# Keys verified only by behaviour (tokenizer parity in gate 2): named when token ids diverge.
BEHAVIOURAL = ("tokenizer.ggml.pre", "tokenizer.ggml.scores", "tokenizer.ggml.add_space_prefix",
               "tokenizer.ggml.remove_extra_whitespaces", "tokenizer.ggml.precompiled_charsmap")
SAMPLING = re.compile(r"general\.sampling\.\w+")


def disposition(key: str) -> str | None:
    """Why an underived key is acceptable ('descriptive' or a reason), or None if it is unexpected."""
    if DESCRIPTIVE.fullmatch(key):
        return "descriptive"
    if key in CHECKED_ELSEWHERE:
        return CHECKED_ELSEWHERE[key]
    if key in NOT_DERIVED:
        return NOT_DERIVED[key]
    if SAMPLING.fullmatch(key):
        return "a default sampling setting for generation; it does not change logits or embeddings"
    return None
