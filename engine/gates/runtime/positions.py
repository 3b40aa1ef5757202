"""Which positions of each text gate 2 compares a causal LM at, and what a GO covers in positions.

Why: the defects platforms have shipped cluster where the first few hundred positions never reach. A
sliding window that was not converted (Phi-3-mini-4k), alternating window and global layers told apart
wrongly (Gemma 3, Mistral-style), rope scaling without its frequencies (Llama 3.1's `rope_freqs`) or without
its YaRN keys, a logit soft-cap handled differently: each is exact for a short text and wrong past the
window or the original context. So every text is compared on its first positions, and a text longer than
that also at the batch of positions that holds each sliding window's edge, the first position a whole window
past it (`fully_past`), the rope scaling's original context, and its own end; the positions past the first
of those marks are also judged alone (`past_mark`). Only those positions' logits exist (the stream asks for
them); the reference and llama.cpp still read every token before them.

The built-in long text reaches `long_context_tokens` positions: the policy's number, or by default the
smaller of the model's trained context and what the pod can afford (`LONG_CONTEXT_BYTES` of llama.cpp's KV
cache and the reference's activations per token; `LONG_CONTEXT_WORK` weights x positions, so a larger model
gets a shorter text; at most `LONG_CONTEXT_CAP` positions), and always one batch past twice the widest
sliding window the trained context allows. Spans are whole decode batches (`decode_batch`):
llama.cpp's numbers depend on how a text is batched, so every run batches it alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.gates.runtime.logits_parity import PastMark

LONG_CONTEXT_BYTES = 2 << 30  # llama.cpp's KV cache + the reference's activations of one layer, per long text
# What a long text may cost in time, as weights x positions: each position passes every layer's matrices once
# per runtime, so a 7B model pays for one position what SmolLM2-135M pays for sixty. 2^40 is SmolLM2's whole
# trained context (8,192 positions); a 7B gets ~170, and the report names what that leaves unverified
LONG_CONTEXT_WORK = 1 << 40
# Attention grows with the square of the length, which the weights do not see: a tiny model trained for 128k
# positions still stops here. A policy may ask for more (docs/gate2.md)
LONG_CONTEXT_CAP = 8192
ACTIVATION_FLOATS = 16  # float32 values of the hidden width the reference holds per token at one layer
NEAR_END = 16  # a long text this close to the trained context reaches it (room for BOS and tokenizers' differences)


@dataclass(frozen=True, slots=True)
class Marks:
    """The positions a long text must be compared past, from the model's configuration."""

    windows: tuple[int, ...]  # every sliding window its attention layers declare
    original_context: int | None  # the context rope scaling stretches (None: no scaling)
    trained_context: int


def _rope_parameters(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every rope parameter set (one per layer type in Gemma 3), old `rope_scaling` included."""
    found = []
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if isinstance(value, Mapping):
            nested = [v for v in value.values() if isinstance(v, Mapping)]
            found.extend(nested or [value])
    return found


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal config's text model config, or the config itself."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def marks(config: Mapping[str, Any]) -> Marks:
    """The windows and the original context a source's config.json declares (a text config inside a
    multimodal one is read the same way)."""
    text = _text_config(config)
    value = text.get("sliding_window")
    window = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
    layer_types = text.get("layer_types")
    declared = window > 0 and ("sliding_attention" in layer_types if isinstance(layer_types, list) else
                               text.get("use_sliding_window", True) is not False)
    scaled = [p for p in _rope_parameters(text) if p.get("rope_type", p.get("type", "default")) not in
              ("default", None)]
    originals = [p.get("original_max_position_embeddings") for p in scaled]
    original = next((o for o in originals if isinstance(o, int) and o > 0), None)
    value = text.get("max_position_embeddings")
    trained = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
    reachable = declared and (not trained or window < trained)  # a window as wide as the context never slides
    return Marks(windows=(window,) if reachable else (), original_context=original, trained_context=trained)


def bytes_per_token(config: Mapping[str, Any]) -> int:
    """What one more token of the long text costs in memory: llama.cpp's float16 keys and values in every
    layer, and the reference's float32 activations of one layer (several of the hidden width, three of the
    MLP's)."""
    text = _text_config(config)

    def number(key: str, default: int) -> int:
        value = text.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

    hidden, heads = number("hidden_size", 4096), number("num_attention_heads", 32)
    head_dim = number("head_dim", hidden // heads)
    kv = 2 * number("num_key_value_heads", heads) * head_dim
    return number("num_hidden_layers", 32) * kv * 2 + 4 * (ACTIVATION_FLOATS * hidden + 3 *
                                                           number("intermediate_size", 4 * hidden))


def layer_weights(config: Mapping[str, Any]) -> int:
    """The matrix weights every position passes through in the layers (attention projections and the MLP's
    three; a mixture of experts counts the experts a token uses), the per-position cost of a forward pass."""
    text = _text_config(config)

    def number(key: str, default: int) -> int:
        value = text.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default

    hidden, heads = number("hidden_size", 4096), number("num_attention_heads", 32)
    head_dim = number("head_dim", hidden // heads)
    attention = hidden * head_dim * 2 * (heads + number("num_key_value_heads", heads))
    experts = number("num_experts_per_tok", 0)
    mlp = 3 * hidden * (experts * number("moe_intermediate_size", 0) if experts and "moe_intermediate_size" in text
                        else number("intermediate_size", 4 * hidden))
    return number("num_hidden_layers", 32) * (attention + mlp)


def long_context_tokens(config: Mapping[str, Any], context_length: int, requested: int | None, batch: int) -> int:
    """How long the built-in long text is: the policy's number, or what the pod affords in memory and time,
    never past the context the file declares, and one batch past twice the widest sliding window that context
    allows."""
    found = marks(config)
    trained = min(context_length, found.trained_context or context_length)
    if requested is not None:
        return min(requested, trained)
    afforded = min(LONG_CONTEXT_BYTES // max(bytes_per_token(config), 1), LONG_CONTEXT_WORK // layer_weights(config),
                   LONG_CONTEXT_CAP) // batch * batch
    past_windows = max((fully_past(w) + batch for w in found.windows if fully_past(w) + batch <= trained), default=0)
    return max(min(afforded, trained), past_windows)


def fully_past(window: int) -> int:
    """The first position whose whole window-sized stretch of earlier tokens lies past the window: from here a
    runtime that attends too far (or not far enough) sees a whole window of tokens the other does not, while
    just past the window it differs by a handful, which a conversion's noise can hide."""
    return 2 * window


def past_mark(found: Marks, longest_position: int) -> PastMark | None:
    """The first window or original context the compared positions went past, to judge those positions alone."""
    reached = [(w, f"the sliding window of {w} tokens") for w in found.windows if w <= longest_position]
    if found.original_context and found.original_context <= longest_position:
        reached.append((found.original_context, f"the original context of {found.original_context} tokens"))
    return PastMark(*min(reached)) if reached else None


def spans(length: int, first: int, batch: int, found: Marks) -> list[tuple[int, int]]:
    """The positions of a text of `length` tokens compared, as [start, stop) spans of whole batches: its
    first `first` positions (rounded up to a batch), and, past them, the batch holding each window's edge
    and the original context, and the text's last batch."""
    batches = {index for index in range(-(-min(first, length) // batch))}
    if length > first:
        edges = [*found.windows, *(fully_past(w) for w in found.windows),
                 *((found.original_context,) if found.original_context else ()), length - 1]
        batches |= {edge // batch for edge in edges if edge < length}
    out: list[tuple[int, int]] = []
    for index in sorted(batches):
        start, stop = index * batch, min(length, (index + 1) * batch)
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], stop)
        else:
            out.append((start, stop))
    return out


@dataclass(frozen=True, slots=True)
class Coverage:
    """What the compared positions reached, for the report."""

    longest_position: int  # the furthest position compared (0-based), over every text
    windows_crossed: tuple[int, ...]
    windows_not_crossed: tuple[int, ...]
    original_context_crossed: bool | None  # None: no rope scaling declared


def coverage(compared: Sequence[Sequence[tuple[int, int]]], found: Marks) -> Coverage:
    """A window (or the original context) is crossed when a position at or past it was compared."""
    furthest = max((stop - 1 for text in compared for _, stop in text), default=-1)
    crossed = tuple(w for w in found.windows if furthest >= w)
    return Coverage(longest_position=furthest, windows_crossed=crossed,
                    windows_not_crossed=tuple(w for w in found.windows if w not in crossed),
                    original_context_crossed=None if found.original_context is None else
                    furthest >= found.original_context)


def position_gaps(reached: Mapping[str, Any]) -> list[str]:
    """What the compared positions did not reach, as the report's not-verified lines (the report's
    `logits.positions`)."""
    gaps = [f"positions past the sliding window of {window} tokens (no text was compared there)"
            for window in reached["windows"] if window not in reached["windows_crossed"]]
    if reached.get("original_context_crossed") is False:
        gaps.append(f"positions past the original context of {reached['original_context']} tokens that rope "
                    "scaling stretches")
    furthest, trained = reached["longest_position"] + 1, reached.get("trained_context") or 0
    if trained and furthest < trained - NEAR_END:
        gaps.append(f"positions past {furthest} (the model is trained for {trained}): the long text stops at the "
                    "policy's long_context_tokens or what the pod affords")
    return gaps
