"""Gate 2, tokenizer: HF `tokenizers` vs llama.cpp token ids, every text, every flag combination.

What the HF post-processor template adds (a leading and/or trailing special token) is compared
with what llama.cpp *actually* adds, probed by tokenizing with and without `add_special`; the GGUF
flags are reported beside. A failure carries its shape: a constant length offset means a special
token, divergence only on non-ASCII text means normalisation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.blockers import Blocker
from engine.gates.storage.metadata_keys import BEHAVIOURAL
from engine.texts import Text

# (add_special, parse_special)
COMBINATIONS: tuple[tuple[bool, bool], ...] = ((True, True), (True, False), (False, True), (False, False))
# GGUF keys that change how llama.cpp splits or normalises text, per tokenizer model (llama-vocab.cpp). The
# pre-tokenizer probe blocks where a key governs what it probes. llama.cpp's WordPiece path reads none (it
# normalises by fixed rules and ignores tokenizer.ggml.pre), and its Unigram (t5) normaliser parts from
# transformers' on the probe with every key exactly the source's (`\r\n` then a space gives one more `▁`,
# XLM-R's own vocabulary), so those families' probe divergences are a property of llama.cpp's support for
# them, reported with the texts that show them, never of one file; their keys are still judged on the
# submitter's texts.
GOVERNING_KEYS: dict[str, tuple[str, ...]] = {
    "gpt2": ("tokenizer.ggml.pre",),
    "llama": ("tokenizer.ggml.add_space_prefix", "tokenizer.ggml.remove_extra_whitespaces"),
}
DEFAULT_COMBINATION = (True, False)  # what llama.cpp's embedding and completion paths use
PROBE = "hello"


class Tokenize(Protocol):
    def __call__(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class TemplateFacts:
    """Special tokens the HF post-processor puts before and after a single sequence."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    kind: str


def special_token_ids(processor: Mapping[str, Any], token: str | None) -> tuple[int, ...]:
    """The ids a post-processor's named special token stands for (none for an unknown name)."""
    entry = (processor.get("special_tokens") or {}).get(token) or {}
    return tuple(int(i) for i in entry.get("ids", ()))


def _template(processor: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    kind = processor.get("type")
    if kind == "TemplateProcessing":
        single = processor.get("single") or []
        seq = next((i for i, item in enumerate(single) if "Sequence" in item), len(single))
        prefix = tuple(i for item in single[:seq] for i in special_token_ids(processor, item["SpecialToken"]["id"]))
        suffix = tuple(i for item in single[seq + 1:] for i in special_token_ids(processor, item["SpecialToken"]["id"]))
        return prefix, suffix
    if kind in ("BertProcessing", "RobertaProcessing"):
        return (int(processor["cls"][1]),), (int(processor["sep"][1]),)
    if kind == "Sequence":
        before: tuple[int, ...] = ()
        after: tuple[int, ...] = ()
        for inner in processor.get("processors") or []:
            inner_prefix, inner_suffix = _template(inner)
            before, after = before + inner_prefix, after + inner_suffix
        return before, after
    return (), ()


def template_facts(tokenizer_json: dict[str, Any]) -> TemplateFacts:
    processor = tokenizer_json.get("post_processor") or {}
    prefix, suffix = _template(processor)
    return TemplateFacts(prefix, suffix, str(processor.get("type", "none")))


def normalizer_steps(tokenizer_json: dict[str, Any]) -> list[str]:
    """Normaliser steps in order, e.g. ['NFC'] or ['BertNormalizer(lowercase, strip_accents=None)']."""
    def describe(node: dict[str, Any] | None) -> list[str]:
        if not node:
            return []
        if node.get("type") == "Sequence":
            return [step for inner in node.get("normalizers", []) for step in describe(inner)]
        if node.get("type") == "BertNormalizer":
            flags = [k for k in ("clean_text", "handle_chinese_chars", "lowercase") if node.get(k)]
            return [f"BertNormalizer({', '.join(flags)}, strip_accents={node.get('strip_accents')})"]
        return [str(node.get("type"))]

    return describe(tokenizer_json.get("normalizer"))


@dataclass
class TokenizerResult:
    matching_combinations: list[str]
    per_combination: dict[str, int]
    template: dict[str, Any]
    llama_adds: dict[str, list[int]]
    gguf_flags: dict[str, Any]
    normalizer: list[str]
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    probe_divergences: list[str] = field(default_factory=list)  # probe texts that differ where no key governs
    diagnosis: str | None = None
    blockers: list[Blocker] = field(default_factory=list)
    default_ids_equal: dict[str, bool] = field(default_factory=dict)

    def details(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if key != "blockers"}


def _name(combination: tuple[bool, bool]) -> str:
    return f"add_special={combination[0]},parse_special={combination[1]}"


def ids_agree(hf_ids: list[int], llama_ids: list[int]) -> bool:
    """The tokenizer comparison: the same ids in the same order, nothing normalised on either side."""
    return hf_ids == llama_ids


def _first_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def diagnose(mismatches: list[dict[str, Any]], texts: tuple[Text, ...], normalizer: list[str],
             suspects: tuple[str, ...] = ()) -> str | None:
    """Name the shape of the failure, not just the count."""
    if not mismatches:
        return None
    offsets = {len(m["llama_ids"]) - len(m["hf_ids"]) for m in mismatches}
    if len(offsets) == 1 and 0 not in offsets and len(mismatches) == len(texts):
        return (f"constant length offset of {offsets.pop():+d} on every text: a special token is added or "
                "dropped (check add_bos/add_eos and the post-processor)")
    failing = {m["label"] for m in mismatches}
    ascii_failing = [t.label for t in texts if t.label in failing and t.text.isascii()]
    if not ascii_failing:
        return (f"ids diverge only on non-ASCII texts ({', '.join(sorted(failing))}): normalisation differs "
                f"(HF normaliser: {', '.join(normalizer) or 'none'}; llama.cpp does not reproduce it)")
    named = f"; gate 1 compares vocabulary and merges, the keys only behaviour verifies are {', '.join(suspects)}" \
        if suspects else ""
    return f"ids diverge on ASCII text too: vocabulary, merges or pre-tokenizer differ{named}"


def _short(value: Any) -> Any:
    return f"<{len(value)} values>" if hasattr(value, "__len__") and not isinstance(value, str) else value


def _llama_adds(tokenize: Tokenize) -> tuple[tuple[int, ...], tuple[int, ...]]:
    with_special = tokenize(PROBE, add_special=True, parse_special=False)
    plain = tokenize(PROBE, add_special=False, parse_special=False)
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start:start + len(plain)] == plain:
            return tuple(with_special[:start]), tuple(with_special[start + len(plain):])
    return tuple(with_special), ()


def check_tokenizer(
    texts: tuple[Text, ...],
    hf: Tokenize,
    llama: Tokenize,
    tokenizer_json: dict[str, Any],
    gguf_metadata: dict[str, Any],
    ids_exact: bool,
) -> TokenizerResult:
    template = template_facts(tokenizer_json)
    prefix, suffix = _llama_adds(llama)
    flags = {k: gguf_metadata.get(f"tokenizer.ggml.{k}") for k in
             ("add_bos_token", "add_eos_token", "bos_token_id", "eos_token_id", "model", "pre")}
    result = TokenizerResult(
        matching_combinations=[], per_combination={},
        template={"kind": template.kind, "prefix": list(template.prefix), "suffix": list(template.suffix)},
        llama_adds={"prefix": list(prefix), "suffix": list(suffix)},
        gguf_flags=flags, normalizer=normalizer_steps(tokenizer_json),
    )

    def block(code: str, why: str, text: str | None = None) -> None:
        result.blockers.append(Blocker(code=code, gate="runtime", why=why, text=text))

    if prefix != template.prefix:
        key, why = _flag_source("add_bos_token", flags)
        result.blockers.append(Blocker(code="tokenizer.add_bos_mismatch", gate="runtime", key=key, why=(
            f"the template starts with {list(template.prefix)}, llama.cpp adds {list(prefix)} ({why})")))
    if suffix != template.suffix:
        key, why = _flag_source("add_eos_token", flags)
        result.blockers.append(Blocker(code="tokenizer.add_eos_mismatch", gate="runtime", key=key, why=(
            f"the template ends with {list(template.suffix)}, llama.cpp adds {list(suffix)} ({why})")))
    eos = flags["eos_token_id"]
    if template.suffix and (len(template.suffix) > 1 or (eos is not None and template.suffix[0] != eos)):
        block("tokenizer.template_token_mismatch", f"the template appends {list(template.suffix)}, but GGUF can "
              f"auto-append only its EOS token ({eos})")
    governed = bool(GOVERNING_KEYS.get(str(flags["model"]), ()))
    # where no key governs the split, the probe and our non-ASCII default texts (Korean: BERT's normaliser
    # decomposes Hangul, llama.cpp's does not) show what llama.cpp's support for the family does, not this
    # file: reported; the submitter's texts are their contract, and our ASCII ones the controls' target: judged
    judged = tuple(text for text in texts
                   if governed or not (text.is_probe or (text.builtin and not text.text.isascii())))
    for combination in COMBINATIONS:
        add_special, parse_special = combination
        matched = 0
        for text in texts:
            hf_ids = hf(text.text, add_special=add_special, parse_special=parse_special)
            llama_ids = llama(text.text, add_special=add_special, parse_special=parse_special)
            agree = ids_agree(hf_ids, llama_ids)
            matched += agree or text not in judged
            if combination == DEFAULT_COMBINATION:
                result.default_ids_equal[text.label] = agree
                if not agree and text not in judged:
                    result.probe_divergences.append(text.label)
                elif not agree:
                    result.mismatches.append({
                        "label": text.label, "text": text.text, "hf_ids": hf_ids, "llama_ids": llama_ids,
                        "first_divergence": _first_divergence(hf_ids, llama_ids),
                    })
        result.per_combination[_name(combination)] = matched
        if matched == len(texts):
            result.matching_combinations.append(_name(combination))
    suspects = tuple(f"{key}={_short(gguf_metadata[key])!r}" for key in BEHAVIOURAL if key in gguf_metadata)
    result.diagnosis = diagnose(result.mismatches, judged, result.normalizer, suspects)
    if not result.matching_combinations and ids_exact:
        for mismatch in result.mismatches or [{"label": "all", "text": None}]:
            block("tokenizer.ids_mismatch",
                  f"no flag combination matches on every text; {mismatch['label']!r} differs "
                  f"({result.diagnosis or 'other combinations differ'})", mismatch["text"])
        result.blockers.extend(_pretokenizer_blockers(result.mismatches, texts, gguf_metadata))
    return result


def _flag_source(flag: str, flags: dict[str, Any]) -> tuple[str, str]:
    """The GGUF key an automatic BOS/EOS comes from: the flag, or, where the file sets none in a BPE vocabulary,
    the pre-tokenizer type, whose defaults llama.cpp applies (llama3's adds BOS)."""
    if flags.get(flag) is None and flags.get("model") == "gpt2":
        return "tokenizer.ggml.pre", (f"the GGUF sets no {flag}, so llama.cpp's default for pre-tokenizer "
                                      f"{flags.get('pre')!r} applies")
    return f"tokenizer.ggml.{flag}", f"GGUF {flag}={flags.get(flag)}"


def _pretokenizer_blockers(mismatches: list[dict[str, Any]], texts: tuple[Text, ...],
                           gguf_metadata: dict[str, Any]) -> list[Blocker]:
    """In a BPE vocabulary (whose tokens and merges gate 1 compares), ids that differ are split differently
    before the merges: the pre-tokenizer the GGUF names. One blocker per probe class that shows it."""
    if gguf_metadata.get("tokenizer.ggml.model") != "gpt2" or not mismatches:
        return []
    failing = {m["label"] for m in mismatches}
    named = f"tokenizer.ggml.pre = {_short(gguf_metadata.get('tokenizer.ggml.pre'))!r}"
    probed = [t for t in texts if t.is_probe and t.label in failing]
    return [Blocker(code="tokenizer.pretokenizer_mismatch", gate="runtime", key="tokenizer.ggml.pre", text=t.text,
                    why=f"{named}: llama.cpp splits the {t.slice.removeprefix('probe:')!r} probe unlike the HF "
                        "pre-tokenizer (vocabulary and merges are gate 1's; what is left is the pre-tokenizer)")
            for t in probed] or [Blocker(code="tokenizer.pretokenizer_mismatch", gate="runtime",
                                        key="tokenizer.ggml.pre",
                                        why=f"{named}: ids differ on {sorted(failing)} in a BPE vocabulary")]
