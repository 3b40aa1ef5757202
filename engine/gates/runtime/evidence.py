"""What gate 2 compared, kept so the negative controls can re-run its comparisons in memory.

Gate 2's comparisons take functions (tokenize, embed, logits). Each is wrapped in `Recorded`, which
calls through and keeps every answer by its arguments; a control then calls the very same comparison
function on those answers with one planted defect, without running either model again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from engine.blockers import Blocker
from engine.gates.runtime.logits_stream import KeptBlock
from engine.policy import Policy
from engine.runtime.sentence_config import SentenceConfig
from engine.texts import Text
from engine.thresholds import RuntimeThresholds


def _frozen(value: Any) -> Hashable:
    return tuple(value) if isinstance(value, list | tuple) else value


class Recorded:
    """`fn`, answering as before, with its answers kept by their arguments for `replay`: every answer, or
    only the first `keep` (a causal LM's logits are positions x vocabulary floats per text: one is enough)."""

    def __init__(self, fn: Callable[..., Any], keep: int | None = None) -> None:
        self._fn = fn
        self._keep = keep
        self.answers: dict[Hashable, Any] = {}

    @staticmethod
    def key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
        return tuple(_frozen(a) for a in args), tuple(sorted(kwargs.items()))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        answer = self._fn(*args, **kwargs)
        if self._keep is None or len(self.answers) < self._keep:
            self.answers[self.key(args, kwargs)] = answer
        return answer

    def again(self, *args: Any, **kwargs: Any) -> Any:
        """The answer already given to these arguments, or a new one (kept like any other)."""
        key = self.key(args, kwargs)
        return self.answers[key] if key in self.answers else self(*args, **kwargs)

    def replay(self, *args: Any, **kwargs: Any) -> Any:
        """The answer the gate got; a KeyError when the gate never asked (a control must not run a model)."""
        return self.answers[self.key(args, kwargs)]


@dataclass(frozen=True, kw_only=True)
class TokenizerEvidence:
    """`check_tokenizer`'s inputs as the gate called it, and the blockers it found."""

    hf: Recorded
    llama: Recorded
    tokenizer_json: dict[str, Any]
    metadata: dict[str, Any]
    ids_exact: bool
    default_ids_equal: dict[str, bool]
    blockers: tuple[Blocker, ...]


@dataclass(frozen=True, kw_only=True)
class EmbeddingEvidence:
    """`check_embeddings`'s inputs as the gate called it, its per-text rows and blockers."""

    reference: Recorded
    candidate: Recorded
    sentence: SentenceConfig
    ids_equal: dict[str, bool]
    policy: Policy
    thresholds: RuntimeThresholds
    per_text: tuple[dict[str, Any], ...]
    blockers: tuple[Blocker, ...]


@dataclass(frozen=True, kw_only=True)
class LogitsEvidence:
    """The first positions of the first text, both sides' logits (a block of a vocabulary of floats per
    position: gate 2 keeps no more), and what the comparison held them to."""

    kept: KeptBlock | None
    policy: Policy
    thresholds: RuntimeThresholds


@dataclass(frozen=True, kw_only=True)
class RuntimeEvidence:
    """Everything gate 2 measured that a control may replay, per comparison that ran."""

    texts: tuple[Text, ...]
    tokenizer: TokenizerEvidence | None = None
    embeddings: EmbeddingEvidence | None = None
    logits: LogitsEvidence | None = None
