"""The one table of blocker codes.

Every code a gate can raise is listed here with a one-line meaning, so that operators and
auditors can rely on codes being stable and documented. `Blocker` refuses unknown codes, and a
test greps the engine for codes that are not in this table.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

GateName = Literal["storage", "runtime", "release"]  # the registered gates (engine/gates/registry.py)
Gate = Literal[GateName, "input", "verifier"]  # what a blocker is filed under: a gate, the input or the verifier

BLOCKER_CODES: dict[str, str] = {
    # --- GGUF structure (our bounded parser, before gguf-py or llama.cpp open the file) ---
    "gguf.bad_magic": "the file does not start with the GGUF magic",
    "gguf.byte_swapped": "the header is big-endian (byte-swapped); only little-endian GGUF is accepted",
    "gguf.bad_version": "GGUF version 0, 1 or newer than this verifier understands",
    "gguf.bad_count": "tensor or key/value count is negative, absurd or larger than the file could hold",
    "gguf.bad_key": "a metadata key is empty, too long or not valid UTF-8",
    "gguf.duplicate_key": "a metadata key appears twice",
    "gguf.bad_value_type": "a metadata value has an unknown type",
    "gguf.nested_array": "a metadata array holds arrays",
    "gguf.length_out_of_range": "a string or array length runs past the end of the file",
    "gguf.bad_alignment": "general.alignment is not a u32 power of two",
    "gguf.bad_tensor_name": "a tensor name is empty, too long or not valid UTF-8",
    "gguf.duplicate_tensor": "two tensors share a name",
    "gguf.bad_n_dims": "a tensor has zero or more than four dimensions",
    "gguf.bad_shape": "a tensor dimension is negative or the element count overflows",
    "gguf.bad_tensor_type": "a tensor has an unknown or removed ggml type",
    "gguf.bad_row_size": "a tensor's row length is not a multiple of its type's block size",
    "gguf.offset_misaligned": "a tensor's data offset is not a multiple of the alignment",
    "gguf.tensor_overlap": "two tensors' data ranges overlap",
    "gguf.tensor_out_of_order": "tensor data is not laid out in declaration order",
    "gguf.tensor_gap": "there are unexplained bytes between two tensors' data",
    "gguf.tensor_out_of_bounds": "a tensor's data runs past the end of the file",
    "gguf.truncated": "the file ends before its header or data does",
    "gguf.trailing_data": "the file has bytes after the last tensor's padded data",
    "gguf.bad_tokenizer_array": "a tokenizer array has the wrong element type or length",
    "gguf.unreadable": "the file could not be opened or read",
    # --- source model ---
    "source.unsafe_format": "the source holds a pickle checkpoint (.bin/.pt/.pth/.ckpt), which is never loaded",
    "source.missing": "the source directory lacks config.json or any safetensors weights",
    "source.bad_config": "config.json is not a JSON object, or a hyperparameter in it is not a number in range",
    "source.bad_file": "a tokenizer or sentence-transformers file is not valid JSON or not the shape its format has",
    "source.bad_safetensors": "a safetensors header is malformed or inconsistent with the file",
    "source.duplicate_tensor": "a tensor name appears twice in safetensors headers or across shards",
    "source.index_mismatch": "model.safetensors.index.json disagrees with the shard headers",
    "source.unsupported_architecture": "transformers cannot build the source's architecture: gate 2 has no reference",
    "source.packed_mismatch": "packed low-bit metadata (bits, group size) disagrees with the stored bytes",
    # --- gate 1: inventory and values ---
    "tensor.missing": "a source tensor that must be in the GGUF is not there",
    "tensor.unexpected": "a GGUF tensor has no source tensor it could come from",
    "tensor.shape_mismatch": "a GGUF tensor's shape differs from its (transformed) source",
    "tensor.value_mismatch": "a tensor's values differ from its source beyond what its type allows",
    "tensor.not_finite": "a tensor holds NaN or infinity where the source does not",
    "tensor.type_unsupported": "no independent check exists for this tensor type, so it cannot be verified",
    "tensor.reproduction_mismatch": "re-quantizing the source does not give the stored bytes",
    "tensor.not_reproduced": "not a defect: the tensor cannot be reproduced without its importance matrix",
    "tensor.other_quantizer": "not a defect: a type differs systematically, as another quantizer would",
    "metadata.mismatch": "GGUF architecture metadata disagrees with config.json or with the tensors present",
    "metadata.missing": "a required GGUF metadata key is absent",
    "metadata.wrong_type": "a GGUF metadata value has a type llama.cpp does not accept for its key",
    "metadata.unsupported_architecture": "the GGUF architecture has no name map in this verifier",
    "metadata.pooling_mismatch": "the GGUF pooling type differs from the source model's pooling",
    "metadata.unexpected_key": "a GGUF key llama.cpp may read is present, but nothing in the source says it should be",
    "tokenizer.flag_mismatch": "add_bos/add_eos/add_sep (or the token they add) disagree with the HF template",
    # --- gate 2: runtime parity ---
    "tokenizer.ids_mismatch": "no (add_special, parse_special) combination gives HF's token ids on every text",
    "tokenizer.add_bos_mismatch": "llama.cpp's automatic leading token differs from the HF post-processor",
    "tokenizer.add_eos_mismatch": "llama.cpp's automatic trailing token differs from the HF post-processor",
    "tokenizer.template_token_mismatch": "the HF template appends a token GGUF cannot auto-append (not its EOS)",
    "embedding.cosine_below_threshold": "a text's embedding cosine to the reference is below the policy minimum",
    "embedding.top1_mismatch": "retrieval top-1 on the built-in set differs from the reference",
    "embedding.not_finite": "llama.cpp returned a non-finite embedding",
    "embedding.rank_swapped": "llama.cpp reversed the order of a decisive passage pair of the labelled retrieval set "
    "(at the width named)",
    "logits.nmse_above_threshold": "logits NMSE against the reference exceeds the policy maximum",
    "logits.kl_above_threshold": "KL divergence from the reference exceeds the policy maximum",
    "logits.top1_below_threshold": "top-1 token agreement with the reference is below the policy minimum",
    "logits.not_finite": "llama.cpp returned non-finite logits",
    "rerank.pair_mismatch": "llama.cpp builds a (query, document) pair from other tokens than the HF template",
    "rerank.score_above_threshold": "a pair's relevance score differs from the reference beyond the policy maximum",
    "rerank.order_mismatch": "llama.cpp orders a query's documents differently from the reference",
    "rerank.not_finite": "llama.cpp returned a non-finite relevance score",
    "runtime.load_failed": "llama.cpp could not load the GGUF",
    "runtime.crashed": "llama.cpp died (a signal, an exit or a hang) loading or running the GGUF",
    "runtime.no_artifact_reference": "gate 2 cannot rebuild the model from the artifact's own weights to compare with",
    "runtime.refused_to_load": "the GGUF's metadata contradicts its tensors, so it is not handed to llama.cpp",
    "runtime.unknown_model_kind": "neither an embedding model (pooling config) nor a causal LM",
    "tokenizer.pretokenizer_mismatch": "llama.cpp's pre-tokenizer (tokenizer.ggml.pre) splits the probe unlike HF's",
    "chat.template_mismatch": "the chat template a runtime applies gives other token ids than HF's apply_chat_template",
    "chat.double_bos": "a rendered conversation starts with BOS twice (the template writes one, the runtime adds one)",
    "quality.kl_above_budget": "the KL divergence from the source model exceeds the policy's quality budget",
    "quality.same_top_below_budget": "the top token differs from the source model's more often than the budget allows",
    "quality.ppl_above_budget": "the perplexity ratio to the source model exceeds the policy's quality budget",
    "quality.cosine_below_budget": "an embedding's cosine to the source model is below the policy's quality floor",
    "quality.top1_differs_from_source": "retrieval top-1 differs from the source model's",
    "quality.retrieval_below_budget": "nDCG@10 on the labelled retrieval set fell below the source's by more than "
    "the policy's quality budget (at the width named)",
    # --- gate 3: the released file ---
    "release.file_changed": "the file to release no longer has the digest that was measured",
    "release.dimension_mismatch": "the released file's embedding dimension differs from its metadata",
    "release.not_finite": "the released file produced non-finite outputs",
    "release.zero_norm": "the released file produced an all-zero embedding",
    "release.top1_changed": "the released file's top-1 results differ from those measured in gate 2",
    "release.score_changed": "the released file's relevance scores differ from those measured in gate 2",
    "release.order_changed": "the released file orders a query's documents differently from gate 2",
    "release.missing_file": "a file of the release package cannot be read",
    # --- verifier self-checks ---
    "verifier.reader_disagreement": "gguf-py and libggml dequantize the same block differently",
    "verifier.reference_missing": "a reference implementation needed for a check is unavailable",
    "verifier.control_not_detected": "a defect planted in memory in this artifact passed a gate's own comparison",
    "measurement.contradiction": "two measurements of the same thing contradict each other",
    # --- gate selection ---
    "gate.not_run": "a requested gate is not implemented or could not run, so no GO can cover it",
    # --- artifacts ---
    "artifact.sha256_mismatch": "the artifact's sha256 differs from the expected digest",
    "artifact.unreadable": "the artifact could not be fetched or opened",
    "artifact.fetch_failed": "the URI could not be fetched (unreachable, refused, too large or bad redirect)",
    # --- a gguf-split artifact (model-0000k-of-0000n.gguf shards read as one model) ---
    "artifact.split_missing_shard": "a shard of a gguf-split artifact is absent: fewer files than its split.count",
    "artifact.split_foreign_shard": "a file is not a shard of this split: its split.count, total or metadata differ",
    "artifact.split_index_mismatch": "a shard's split.no disagrees with its position or its -0000k-of-0000n file name",
    "artifact.split_duplicate_tensor": "a tensor name appears in two shards of a gguf-split artifact",
    "artifact.split_tensor_count_mismatch": "the shards' tensors together are not the split.tensors.count they declare",
    # --- the importance matrix (--imatrix / imatrix_uri) ---
    "imatrix.malformed": "the importance matrix is not a well-formed llama.cpp imatrix (GGUF or legacy .dat)",
    "imatrix.entry_mismatch": "an imatrix entry's length does not fit its tensor: llama-quantize cannot have used it",
    "imatrix.sha256_mismatch": "the importance matrix's sha256 differs from the expected digest",
    "imatrix.unavailable": "the importance matrix could not be fetched or opened",
    # --- publishers' signatures (OpenSSF Model Signing: source_signature_uri / artifact_signature_uri) ---
    "source.signature_invalid": "the source's signature does not verify with a trusted key, or does not cover every "
                                "source file read with the bytes read",
    "artifact.signature_invalid": "the artifact's signature does not verify with a trusted key, or does not cover "
                                  "every file of the artifact with the bytes read",
    "source.signature_required": "the policy requires a valid source signature and none was given",
}


def safe_text(text: str) -> str:
    """`text` with lone surrogates (invalid UTF-8 read with surrogateescape, or a JSON `\\ud800`)
    written as backslash escapes, so every report, log line and database row can encode it."""
    return text.encode(errors="backslashreplace").decode()  # str.encode is always UTF-8


class Blocker(BaseModel):
    """One reason the verdict cannot be GO. Codes must come from `BLOCKER_CODES`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: str
    gate: Gate
    why: str
    tensor: str | None = None
    text: str | None = None
    key: str | None = None

    @field_validator("why", "tensor", "text", "key")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        return None if value is None else safe_text(value)

    @field_validator("code")
    @classmethod
    def _known_code(cls, code: str) -> str:
        if code not in BLOCKER_CODES:
            raise ValueError(f"unknown blocker code {code!r}: add it to BLOCKER_CODES")
        return code
