"""The default text set for gate 2 and the small built-in retrieval set.

The texts are chosen to make known failure shapes visible: scripts whose normalisation differs
between tokenizers (Hangul, Japanese, NFD accents), emoji (byte fallback), a one-character text
and a near-context-limit text (added per model, since the limit is the model's).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

ACCENTED = "Crème brûlée, naïve façade, Ångström and São Paulo."


@dataclass(frozen=True, slots=True)
class Text:
    label: str
    text: str


DEFAULT_TEXTS: tuple[Text, ...] = (
    Text("english", "The quick brown fox jumps over the lazy dog."),
    Text("english-question", "How do I verify that a converted model matches the original weights?"),
    # digit runs, contractions, whitespace runs and punctuation: where pre-tokenizers (tokenizer.ggml.pre) differ
    Text("pretokenizer-probe", "Numbers 7 42 365 2026 3.14159 and 1,000,000; I've, you're, they'll, WE'D.\t"
                               "Tabs  and   spaces,\n\nnewlines -- ok?!"),
    Text("korean", "안녕하세요, 오늘 날씨가 정말 좋네요."),
    Text("japanese", "東京は日本の首都です。今日はいい天気ですね。"),
    Text("accented-nfc", unicodedata.normalize("NFC", ACCENTED)),
    Text("accented-nfd", unicodedata.normalize("NFD", ACCENTED)),
    Text("emoji", "Deploy succeeded 🚀🎉 — all checks green ✅"),
    Text("very-short", "a"),
)

LONG_SENTENCE = "Verification compares every tensor and every token against the reference model. "


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
    return (Text("near-context-limit", (LONG_SENTENCE * low).strip()),)


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
    if not any(t.label == "near-context-limit" for t in texts):
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
