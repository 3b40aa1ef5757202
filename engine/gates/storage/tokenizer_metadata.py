"""What the GGUF `tokenizer.*` keys must hold, derived from the source's tokenizer files alone.

Read independently of any converter: the vocabulary and added tokens of tokenizer.json (padded to
config.vocab_size), the token kinds, BPE merges, special-token ids from tokenizer_config.json, the
chat template as published, and the special-token flags from what the post-processor template
adds. The flags are judged by meaning, not by name: the tokens a flag-reading runtime would add
(`bos` before, `eos` or `sep` after) must be the tokens the Hugging Face template adds, whatever
the llama.cpp build in use does with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import SourceError
from engine.formats.sentencepiece_model import read_pieces
from engine.formats.source import SourceModel
from engine.gates.expectation import Expectation
from engine.gates.runtime.tokenizer_parity import special_token_ids, template_facts

# gguf TokenType values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
PHANTOM_SPACE = "\u2581"
SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
ID_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
           "pad": "padding_token_id", "cls": "cls_token_id", "mask": "mask_token_id"}
# Flags llama.cpp assumes when a key is absent, per tokenizer model (llama-vocab.cpp's defaults).
RUNTIME_FLAG_DEFAULTS: dict[str, dict[str, bool]] = {
    "llama": {"bos": True, "eos": False, "sep": False},
    "bert": {"bos": True, "eos": False, "sep": True},
    "t5": {"bos": False, "eos": True, "sep": False},
    "gpt2": {"bos": False, "eos": False, "sep": False},
}
# XLM-RoBERTa models (bge-m3, multilingual-e5) ship this beside tokenizer.json; the converter then reads the
# vocabulary from it (see sentencepiece_padding).
SENTENCEPIECE_FILE = "sentencepiece.bpe.model"
# A SentencePiece model the converter reads a llama-type vocabulary from (before tokenizer.json).
SPM_FILE = "tokenizer.model"
MAX_SPM_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """The parsed tokenizer files of a source model."""

    tokenizer: Mapping[str, Any]
    config: Mapping[str, Any]
    model_config: Mapping[str, Any]
    chat_template: str | None
    sentencepiece_model: bool = False
    spm_pieces: tuple[tuple[str, int, float], ...] | None = None  # tokenizer.model's pieces, where there is one
    added_tokens_file: Mapping[str, Any] | None = None  # added_tokens.json

    @classmethod
    def read(cls, source: SourceModel) -> TokenizerFiles | None:
        tokenizer = source.read_json("tokenizer.json")
        if not isinstance(tokenizer, dict):
            return None
        config = source.read_json("tokenizer_config.json") or {}
        template = config.get("chat_template")
        if template is None:
            template = source.read_text("chat_template.jinja")
        spm = source.root / SPM_FILE
        if spm.is_file() and spm.stat().st_size > MAX_SPM_BYTES:
            raise SourceError("source.bad_file", f"{SPM_FILE} is larger than {MAX_SPM_BYTES} bytes")
        added = source.read_json("added_tokens.json")
        return cls(tokenizer, config, source.config, template if isinstance(template, str) else None,
                   (source.root / SENTENCEPIECE_FILE).is_file(),
                   tuple(read_pieces(spm.read_bytes())) if spm.is_file() else None,
                   added if isinstance(added, dict) else None)

    @property
    def model(self) -> Mapping[str, Any]:
        return self.tokenizer.get("model") or {}

    def token_id(self, content: str) -> int | None:
        for added in self.tokenizer.get("added_tokens") or []:
            if added.get("content") == content:
                return int(added["id"])
        vocab = self.model.get("vocab")
        if isinstance(vocab, dict) and content in vocab:
            return int(vocab[content])
        return None


def ggml_model(files: TokenizerFiles) -> str:
    """llama.cpp's tokenizer model for a tokenizer.json model type."""
    kind = files.model.get("type")
    if kind == "WordPiece":
        return "bert"
    if kind == "Unigram":
        return "t5"
    if kind == "BPE" and files.model.get("byte_fallback"):
        return "llama"  # SentencePiece-style BPE with <0xNN> byte tokens
    return "gpt2"


def _special_content(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return str(entry["content"])
    return None


def special_ids(files: TokenizerFiles) -> dict[str, int]:
    """Special-token ids by kind: tokenizer_config.json names them, config.json's *_token_id fills gaps;
    a BERT-style tokenizer's CLS is its BOS and its SEP its EOS."""
    ids: dict[str, int] = {}
    for kind in SPECIAL_KINDS:
        content = _special_content(files.config.get(f"{kind}_token"))
        token = files.token_id(content) if content is not None else None
        if token is None and isinstance(files.model_config.get(f"{kind}_token_id"), int):
            token = int(files.model_config[f"{kind}_token_id"])
        if token is not None:
            ids[kind] = token
    if (unk := _special_content(files.model.get("unk_token"))) and (unk_id := files.token_id(unk)) is not None:
        ids.setdefault("unk", unk_id)  # id 0 is common (<unk>, [PAD]): never test it for truth
    if "cls" in ids:
        ids.setdefault("bos", ids["cls"])
    if "sep" in ids:
        ids.setdefault("eos", ids["sep"])
    return {kind: token for kind, token in ids.items() if token >= 0}  # config.json may say -1: none


def _looks_special(token: str) -> bool:
    return (token.startswith("<|") and token.endswith("|>")) or (token.startswith("<") and token.endswith(">")
                                                                   and token.isascii() and " " not in token)


def _converter_looks_special(token: str) -> bool:
    """The converter's `does_token_look_special` (conversion/base.py), which its SentencePiece path applies."""
    return token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>")) \
        or (token.startswith("<｜") and token.endswith("｜>")) or (token.startswith("<unused") and token.endswith(">"))


@dataclass(frozen=True, slots=True)
class SpmVocabulary:
    """What the converter's SentencePiece path writes: tokens, their types and their scores, by id."""

    tokens: list[str]
    kinds: list[int]
    scores: list[float]


def spm_vocabulary(files: TokenizerFiles, pieces: tuple[tuple[str, int, float], ...]) -> SpmVocabulary:
    """The converter's SentencePiece path (`_create_vocab_sentencepiece`; Phi-3's own `set_vocab`): the model's
    pieces, types and scores padded to vocab_size (-10000), then added_tokens.json as user-defined, then
    tokenizer_config.json's added_tokens_decoder (control when special, or when the token looks special
    outside Phi-3), then for Phi-3 tokenizer.json's added tokens; every added token scores -1000."""
    size = int(files.model_config.get("vocab_size") or len(pieces))
    tokens = [f"[PAD{i}]" for i in range(size)]
    kinds = [UNUSED] * size
    scores = [-10000.0] * size
    for i, (piece, kind, score) in enumerate(pieces[:size]):
        tokens[i], kinds[i], scores[i] = piece, kind, score
    for content, token_id in (files.added_tokens_file or {}).items():
        if isinstance(token_id, int) and 0 <= token_id < size:
            tokens[token_id], kinds[token_id], scores[token_id] = str(content), USER_DEFINED, -1000.0
    phi3 = any(str(a).startswith("Phi3") for a in files.model_config.get("architectures") or ())
    for key, data in (files.config.get("added_tokens_decoder") or {}).items():
        token_id = int(key) if str(key).isdigit() else -1
        if not 0 <= token_id < size or not isinstance(data, dict) or not isinstance(data.get("content"), str):
            continue
        token = data["content"]
        special = bool(data.get("special")) or (not phi3 and _converter_looks_special(token))
        kinds[token_id] = CONTROL if special else USER_DEFINED
        tokens[token_id] = token if special or phi3 else token.replace("\u2581", " ")
        scores[token_id] = -1000.0
    if phi3:  # Phi-3's converter also takes tokenizer.json's added tokens, last
        for added in files.tokenizer.get("added_tokens") or []:
            token_id = int(added["id"])
            if 0 <= token_id < size:
                tokens[token_id] = str(added["content"])
                kinds[token_id] = CONTROL if added.get("special") else USER_DEFINED
                scores[token_id] = -1000.0
    return SpmVocabulary(tokens, kinds, scores)


def vocabulary(files: TokenizerFiles, model: str) -> tuple[list[str], list[int]]:
    """Token strings and kinds by id, padded with `[PADn]` (UNUSED) to config.vocab_size; a SentencePiece
    vocabulary with its tokenizer.model as the converter reads it from that file."""
    if model == "llama" and files.spm_pieces is not None:
        spm = spm_vocabulary(files, files.spm_pieces)
        return spm.tokens, spm.kinds
    by_id: dict[int, str] = {}
    vocab = files.model.get("vocab")
    if isinstance(vocab, dict):
        by_id.update({int(i): str(t) for t, i in vocab.items()})
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        by_id.update({i: str(entry[0]) for i, entry in enumerate(vocab)})
    added = {int(a["id"]): a for a in files.tokenizer.get("added_tokens") or []}
    by_id.update({i: str(a["content"]) for i, a in added.items()})
    size = int(files.model_config.get("vocab_size") or (max(by_id) + 1 if by_id else 0))
    unk = special_ids(files).get("unk")
    tokens: list[str] = []
    kinds: list[int] = []
    for i in range(max(size, max(by_id, default=-1) + 1)):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            kinds.append(UNUSED)
            continue
        if model == "t5" and i == unk:
            kind = UNKNOWN  # a Unigram vocabulary's unknown piece, even when listed among the added tokens
        elif i in added:
            kind = CONTROL if added[i].get("special") or _looks_special(token) else USER_DEFINED
        elif model == "llama" and i == unk:
            kind = UNKNOWN
        elif model == "llama" and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            kind = BYTE
        else:
            kind = NORMAL
        if model == "bert" and kind != CONTROL:
            token = token[2:] if token.startswith("##") else PHANTOM_SPACE + token
        tokens.append(token)
        kinds.append(kind)
    return tokens, kinds


def unigram_scores(files: TokenizerFiles, size: int) -> list[float]:
    """A Unigram vocabulary's piece scores as GGUF stores them (float32), padded like the tokens."""
    vocab = files.model.get("vocab") or []
    scores = [float(np.float32(entry[1])) for entry in vocab]
    return scores + [-10000.0] * (size - len(scores))


def sentencepiece_padding(files: TokenizerFiles) -> int | None:
    """The first id llama.cpp's converter stores as padding when it reads an XLM-R vocabulary from the
    source's sentencepiece.bpe.model (convert_hf_to_gguf XLMRobertaModel._xlmroberta_set_vocab), else None.

    That file holds fairseq's pieces (<unk> <s> </s> ...) without the <pad> and <mask> HF's XLM-R tokenizer
    adds around them; the converter realigns the pieces one id up but never restores <mask> (it does only for
    nomic-bert-moe), so the HF id of <mask>, the last one, and any padding past it, hold `[PAD<id - 1>]`,
    unused, score -10000. Only a tokenizer.json of exactly that layout is read this way."""
    vocab = files.model.get("vocab")
    if not (files.sentencepiece_model and ggml_model(files) == "t5" and isinstance(vocab, list) and len(vocab) > 4):
        return None
    xlmr = any(str(a).startswith("XLMRoberta") for a in files.model_config.get("architectures") or ())
    layout = [str(entry[0]) for entry in vocab[:4]] == ["<s>", "<pad>", "</s>", "<unk>"] and vocab[-1][0] == "<mask>"
    mask = len(vocab) - 1
    return mask if xlmr and layout and special_ids(files).get("mask") == mask else None


def converter_notes(files: TokenizerFiles) -> list[str]:
    """Documented converter quirks the tokenizer expectations accept, for the report's not_verified."""
    mask = sentencepiece_padding(files)
    if mask is None:
        return []
    return [f"tokenizer: <mask> (id {mask}) is expected as [PAD{mask - 1}] (unused, score -10000): llama.cpp's "
            f"converter reads the vocabulary from {SENTENCEPIECE_FILE}, which has no <mask>, and does not restore "
            "it; llama.cpp therefore does not recognise a literal '<mask>' in a text (no embedding or reranking "
            "input needs it); every other token is compared with tokenizer.json"]


def _apply_sentencepiece_padding(files: TokenizerFiles, tokens: list[str], kinds: list[int],
                                 scores: list[float] | None) -> str:
    """Expect the converter's SentencePiece-path padding (sentencepiece_padding); the origin note, or ''."""
    start = sentencepiece_padding(files)
    if start is None:
        return ""
    for i in range(start, len(tokens)):
        tokens[i], kinds[i] = f"[PAD{i - 1}]", UNUSED
        if scores is not None:
            scores[i] = -10000.0
    return f"; from id {start} on as the converter's {SENTENCEPIECE_FILE} path stores them ([PAD<id - 1>])"


_SPACE_IN_MERGE = chr(ord(" ") + 256)  # U+0120, as the converter writes a space inside a merge part


def merges(files: TokenizerFiles) -> list[str] | None:
    """BPE merges as GGUF stores them: 'left right', with spaces inside a part written as U+0120+256."""
    raw = files.model.get("merges")
    if not isinstance(raw, list) or not raw:
        return None
    if isinstance(raw[0], str):
        return [str(m) for m in raw]
    return [" ".join(part.replace(" ", _SPACE_IN_MERGE) for part in pair) for pair in raw]


def template_specials(files: TokenizerFiles) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Token ids the post-processor adds before and after a single sequence."""
    facts = template_facts(dict(files.tokenizer))
    return facts.prefix, facts.suffix


def lowercases(files: TokenizerFiles) -> bool:
    def walk(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if node.get("type") == "Sequence":
            return any(walk(inner) for inner in node.get("normalizers") or [])
        return node.get("type") == "Lowercase" or (node.get("type") == "BertNormalizer" and bool(node.get("lowercase")))

    return walk(files.tokenizer.get("normalizer"))


def tokenizer_expectations(files: TokenizerFiles) -> list[Expectation]:
    """Every tokenizer key a runtime reads that the files determine (flags are checked by meaning, below)."""
    model = ggml_model(files)
    spm = spm_vocabulary(files, files.spm_pieces) if model == "llama" and files.spm_pieces is not None else None
    tokens, kinds = (spm.tokens, spm.kinds) if spm is not None else vocabulary(files, model)
    scores = unigram_scores(files, len(tokens)) if model == "t5" and isinstance(files.model.get("vocab"), list) \
        else None
    quirk = _apply_sentencepiece_padding(files, tokens, kinds, scores)
    out = [
        Expectation("tokenizer.ggml.model", model, "tokenizer.json model.type"),
        Expectation("tokenizer.ggml.tokens", tokens,
                    "tokenizer.json vocab + added_tokens, padded to vocab_size" + quirk),
        Expectation("tokenizer.ggml.token_type", kinds, "tokenizer.json token kinds" + quirk),
    ]
    if scores is not None:
        out.append(Expectation("tokenizer.ggml.scores", scores,
                               "tokenizer.json Unigram piece scores (float32), -10000 for padding" + quirk))
    if spm is not None:
        out.append(Expectation("tokenizer.ggml.scores", spm.scores, "tokenizer.model piece scores (float32), "
                               "-10000 for padding, -1000 for added tokens"))
    if model == "bert" or "type_vocab_size" in files.model_config:
        out.append(Expectation("tokenizer.ggml.token_type_count", int(files.model_config.get("type_vocab_size", 1)),
                               "config.type_vocab_size"))
    if model == "gpt2" and (pairs := merges(files)) is not None:
        out.append(Expectation("tokenizer.ggml.merges", pairs, "tokenizer.json model.merges"))
    for kind, token in special_ids(files).items():
        out.append(Expectation(f"tokenizer.ggml.{ID_KEYS[kind]}", token, f"tokenizer_config.json {kind}_token",
                               optional=True))
    if lowercases(files):
        out.append(Expectation("tokenizer.ggml.normalizer.lowercase", True, "tokenizer.json normalizer"))
    if files.chat_template is not None:
        out.append(Expectation("tokenizer.chat_template", files.chat_template, "tokenizer_config.json chat_template"))
    return out


def pair_middle(tokenizer: Mapping[str, Any]) -> tuple[int, ...] | None:
    """Special tokens the post-processor puts between sequence A and B of a pair (None: no pair template)."""
    processor = tokenizer.get("post_processor") or {}
    processors = processor.get("processors") if processor.get("type") == "Sequence" else [processor]
    middle: tuple[int, ...] | None = None
    for inner in processors or []:
        kind = inner.get("type")
        if kind == "BertProcessing":
            found: tuple[int, ...] = (int(inner["sep"][1]),)
        elif kind == "RobertaProcessing":
            found = (int(inner["sep"][1]),) * 2
        elif kind == "TemplateProcessing" and inner.get("pair"):
            pair = inner["pair"]
            ids = [i for i, item in enumerate(pair) if "Sequence" in item]
            if len(ids) != 2:
                continue
            found = tuple(t for item in pair[ids[0] + 1:ids[1]]
                          for t in special_token_ids(inner, (item.get("SpecialToken") or {}).get("id")))
        else:
            continue
        middle = (middle or ()) + found
    return middle


@dataclass(frozen=True, slots=True)
class FlagFinding:
    flag: str
    why: str


def expected_flags(prefix: tuple[int, ...], suffix: tuple[int, ...], middle: tuple[int, ...] | None,
                   sep_id: int | None) -> dict[str, Any]:
    """The flags (and the token each adds) that reproduce the HF templates in the format flag-reading runtimes
    use: single = [BOS] A [EOS], pair = [BOS] A [EOS] [SEP] B [EOS]. SEP is None when the pair template is not
    of that form (e.g. llama's `<s> A <s> B`, two sequences each with its BOS): only single sequences are
    then judged."""
    out: dict[str, Any] = {"bos": prefix[:1] or None, "eos": suffix[-1:] or None, "sep": ()}
    if middle is None:
        return out
    eos = out["eos"] or ()
    rest = middle[len(eos):] if middle[:len(eos)] == eos else None
    if rest is None or (rest and (sep_id is None or rest != (sep_id,))):
        out["sep"] = None
    else:
        out["sep"] = rest
    return out


def flag_findings(files: TokenizerFiles, metadata: Mapping[str, Any]) -> tuple[list[FlagFinding], dict[str, Any]]:
    """Compare what add_bos/add_eos/add_sep make a flag-reading runtime add with the HF templates.

    An absent key means the runtime's default for the tokenizer model (llama.cpp's, which other GGUF runtimes
    copy). Judged whatever the llama.cpp build in use does: WordPiece there ignores the flags today."""
    model = str(metadata.get("tokenizer.ggml.model", ggml_model(files)))
    defaults = RUNTIME_FLAG_DEFAULTS.get(model, RUNTIME_FLAG_DEFAULTS["gpt2"])
    prefix, suffix = template_specials(files)
    middle = pair_middle(files.tokenizer)
    wanted = expected_flags(prefix, suffix, middle, special_ids(files).get("sep"))
    ids = {kind: metadata.get(f"tokenizer.ggml.{ID_KEYS[kind]}") for kind in ("bos", "eos", "sep")}
    gguf = {kind: metadata.get(f"tokenizer.ggml.add_{kind}_token") for kind in ("bos", "eos", "sep")}
    effective = {kind: bool(defaults[kind] if gguf[kind] is None else gguf[kind]) for kind in gguf}
    bert_sep_ends = model == "bert" and not effective["eos"] and effective["sep"]
    if bert_sep_ends and wanted["eos"] and ids["sep"] == wanted["eos"][0]:
        # llama.cpp's WordPiece format ends each sequence with SEP when add_sep is set: the same tokens
        wanted = {**wanted, "eos": None, "sep": wanted["eos"]}
    findings = [FlagFinding(f"tokenizer.ggml.add_{kind}_token", f"add_{kind}_token is {value!r}, not a boolean")
                for kind, value in gguf.items() if value is not None and not isinstance(value, bool)]
    for kind in ("bos", "eos", "sep"):
        tokens = wanted[kind]
        if tokens is None and kind == "sep":
            tokens = ()  # a pair template the flags cannot express: a runtime must not invent a separator
        origin = "the GGUF key" if gguf[kind] is not None else f"llama.cpp's default for a {model!r} vocabulary"
        if effective[kind] != bool(tokens):
            where = "pair template" if kind == "sep" else "template"
            findings.append(FlagFinding(
                f"tokenizer.ggml.add_{kind}_token",
                f"add_{kind}_token is {effective[kind]} ({origin}) but the Hugging Face {where} "
                f"{'adds ' + str(list(tokens)) if tokens else 'adds no ' + kind.upper()} "
                f"(single: prefix {list(prefix)}, suffix {list(suffix)}; pair middle "
                f"{list(middle) if middle is not None else None})"))
        elif tokens and (len(tokens) != 1 or ids[kind] != tokens[0]):
            findings.append(FlagFinding(
                f"tokenizer.ggml.{ID_KEYS[kind]}",
                f"add_{kind}_token adds token {ids[kind]}, the Hugging Face template adds {list(tokens)}"))
    details = {"template": {"prefix": list(prefix), "suffix": list(suffix),
                            "pair_middle": list(middle) if middle is not None else None},
               "gguf_flags": gguf, "effective_flags": effective, "model": model,
               "expected": {k: (list(v) if v is not None else None) for k, v in wanted.items()}}
    return findings, details
