"""Gate 2's texts: the submitter's named sets (or the default set), the pre-tokenizer probe, and the
built-in retrieval set.

Every text belongs to a slice: a submitter may name sets (a language, a domain) and gets one slice per
set; the default set is sliced by script; the probe by the class of input it probes. Gate 2 reports its
measures per slice, because the same quantization costs tens of percent more KL in one language than in
another.

The probe is tokenized (and measured) on every run, whatever texts the submitter sent. It covers the
classes of input on which llama.cpp's pre-tokenizer types (`tokenizer.ggml.pre`) split differently: digit
runs, contractions and apostrophes, whitespace runs and newlines, punctuation runs, CJK, emoji, accents and
other scripts. Without it, a file naming another pre-tokenizer was GO whenever a pipeline's own texts
happened to hold no digit. Hangul is in the default set, not the probe: WordPiece models diverge on it by
normalisation (HF decomposes syllables into jamo, llama.cpp does not), which the default set shows.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ACCENTED = "Crème brûlée, naïve façade, Ångström and São Paulo."
SUBMITTED = "submitted"  # the slice of texts sent without a set name
PROBE_PREFIX = "probe:"


@dataclass(frozen=True, slots=True)
class Text:
    label: str
    text: str
    slice: str = SUBMITTED
    builtin: bool = False  # ours (the default set, the probe), not the submitter's

    @property
    def is_probe(self) -> bool:
        return self.slice.startswith(PROBE_PREFIX)


DEFAULT_TEXTS: tuple[Text, ...] = (
    Text("english", "The quick brown fox jumps over the lazy dog.", "english", builtin=True),
    Text("english-question", "How do I verify that a converted model matches the original weights?", "english",
         builtin=True),
    Text("korean", "안녕하세요, 오늘 날씨가 정말 좋네요.", "korean", builtin=True),
    Text("japanese", "東京は日本の首都です。今日はいい天気ですね。", "japanese", builtin=True),
    Text("accented-nfc", unicodedata.normalize("NFC", ACCENTED), "accented", builtin=True),
    Text("accented-nfd", unicodedata.normalize("NFD", ACCENTED), "accented", builtin=True),
    Text("emoji", "Deploy succeeded 🚀🎉 — all checks green ✅", "emoji", builtin=True),
    Text("very-short", "a", "english", builtin=True),
)

# class -> a text exercising it: where llama.cpp's pre-tokenizer regexes (llama-vocab.cpp) part ways
PROBE_CLASSES: dict[str, str] = {
    "digits": "Numbers 7 42 365 2026 3.14159 and 1,000,000; call 0800123456789 or 12345678901234567890.",
    "contractions": "I've, you're, they'll, WE'D, it's, don't, CAN'T, o'clock and 'quoted' words.",
    "whitespace": "Tabs\tand  spaces,   runs\n\nnewlines\r\n \n  indented\t\tline   ",
    "punctuation": "Wait... what?!? -- ok!!! (yes) [no] {maybe} <tag/> a/b/c.txt #hash @user $5 100% ==>",
    "cjk": "东京是日本的首都。東京は日本の首都です。今日はいい天気ですね、ありがとう。",
    "emoji": "Deploy 🚀🎉 ✅ 👩\u200d💻 🏳️\u200d🌈 🇫🇷 1️⃣ done",
    "accents": "Crème brûlée, naïve façade, Ångström, São Paulo, Zürich, Łódź, Dvořák.",
    "scripts": "Привет мир. Γειά σου κόσμε. مرحبا بالعالم. שלום עולם. नमस्ते दुनिया. สวัสดีชาวโลก",
    "code": "def f(x):\n    return x**2 + 1  # comment\nif (a&&b||c) { i++; } else { j--; }",
}
PROBE_TEXTS: tuple[Text, ...] = tuple(Text(f"probe-{name}", text, f"{PROBE_PREFIX}{name}", builtin=True)
                                      for name, text in PROBE_CLASSES.items())


def submitted_texts(texts: Sequence[str] | None, text_sets: Mapping[str, Sequence[str]] | None) -> tuple[Text, ...]:
    """The submitter's texts, one slice per named set (unnamed ones in `submitted`); empty when none."""
    out = [Text(f"line-{i + 1}", text) for i, text in enumerate(texts or ())]
    for name, members in (text_sets or {}).items():
        out.extend(Text(f"{name}-{i + 1}", text, name) for i, text in enumerate(members))
    return tuple(out)


LONG_SENTENCE = "Verification compares every tensor and every token against the reference model. "
# Prose for the long text a causal LM is compared along: varied sentences, cycled to any length.
LONG_PROSE = (
    "The river rose slowly through the night, and by morning the lower fields were under water. "
    "Farmers moved their animals to the ridge, where the old chapel stood among oak trees. "
    "A committee met in the town hall to discuss the budget for the new bridge, which had been delayed twice. "
    "Engineers argued that the foundations needed deeper piles, while the treasurer worried about the cost. "
    "In the library, a student read about the history of navigation, from stars and sextants to satellites. "
    "Early sailors kept careful logs of speed and heading, estimating their position by dead reckoning. "
    "The chef prepared a stew of lentils, carrots and smoked paprika, letting it simmer for an hour. "
    "Guests arrived late because the train had stopped for twenty minutes outside the station. "
    "Mathematicians have long studied prime numbers, which appear irregularly yet follow deep patterns. "
    "A simple program can list them by testing each candidate against the primes found before it. "
    "During the winter, the observatory recorded a faint comet that brightened as it approached the sun. "
    "Its tail, pushed by the solar wind, always pointed away from the sun rather than behind the comet. "
    "The museum opened a new gallery devoted to textiles, with looms, dyes and patterns from five continents. "
    "Visitors could try weaving a short strip of cloth and take it home as a souvenir. "
    "When the storm finally passed, children ran outside to measure the puddles and count the fallen branches. "
)


def long_context_texts(tokens: int, count_tokens) -> tuple[Text, ...]:
    """One text of just under `tokens` tokens (by the model's tokenizer): prose a causal LM is compared
    along, past its sliding windows and out to the long context (engine/gates/runtime/positions.py)."""
    target = max(tokens - 8, 1)
    text = LONG_PROSE
    while count_tokens(text) <= target:
        text += LONG_PROSE
    low, high = 0, len(text)  # the longest prefix that fits, in characters
    while low + 1 < high:
        middle = (low + high) // 2
        if count_tokens(text[:middle]) <= target:
            low = middle
        else:
            high = middle
    return (Text("long-context", text[:low].rstrip(), "english", builtin=True),)


def near_context_texts(context_tokens: int, count_tokens) -> tuple[Text, ...]:
    """One English text whose token count is just under `context_tokens` (by the model's tokenizer)."""
    target = max(context_tokens - 8, 1)
    repeats = 1
    while count_tokens(LONG_SENTENCE * (repeats * 2)) <= target and repeats < 4096:
        repeats *= 2
    low, high = repeats, repeats * 2
    while low + 1 < high:
        middle = (low + high) // 2
        if count_tokens(LONG_SENTENCE * middle) <= target:
            low = middle
        else:
            high = middle
    return (Text("near-context-limit", (LONG_SENTENCE * low).strip(), "english", builtin=True),)


def uncovered_inputs(texts: tuple[Text, ...]) -> list[str]:
    """What kinds of input the text set leaves untested, for the report's `not_verified`."""
    gaps = []
    joined = "".join(t.text for t in texts)
    if all(unicodedata.is_normalized("NFC", t.text) for t in texts):
        gaps.append("non-NFC input (every text was NFC)")
    if joined.isascii():
        gaps.append("non-ASCII input (every text was ASCII)")
    if not any(ord(ch) > 0xFFFF for ch in joined):
        gaps.append("characters outside the Basic Multilingual Plane (emoji)")
    if not any(t.label in ("near-context-limit", "long-context") for t in texts):
        gaps.append("inputs near the context limit")
    return gaps


@dataclass(frozen=True, slots=True)
class RetrievalSet:
    queries: tuple[str, ...]
    documents: tuple[str, ...]


RETRIEVAL = RetrievalSet(
    queries=(
        "What is the capital of France?",
        "How do plants make energy from sunlight?",
        "Which programming language is known for memory safety without garbage collection?",
        "What causes ocean tides?",
        "How do vaccines train the immune system?",
    ),
    documents=(
        "Paris is the capital and largest city of France.",
        "Photosynthesis lets plants turn light, water and carbon dioxide into sugar and oxygen.",
        "Rust guarantees memory safety through ownership and borrowing, without a garbage collector.",
        "Tides are caused mainly by the gravitational pull of the Moon on the oceans.",
        "Vaccines expose the immune system to a harmless antigen so it learns to recognise a pathogen.",
        "The Great Wall of China stretches for thousands of kilometres.",
        "Coffee is brewed from roasted seeds of the Coffea plant.",
    ),
)
