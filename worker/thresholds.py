"""Gate-2 thresholds per precision class, derived from measured honest conversions.

Each class's numbers come from the worst value measured on honest conversions of the fixtures in
that class (`scripts/measure_thresholds.py` re-measures and prints this table), widened by a stated
margin, never narrowed. Distances (NMSE, KL) get a multiplicative margin, cosine a multiplicative
margin on its deficit (1 - cosine), top-1 agreement an absolute slack. A defect that moves a file
a thousand times its honest distance is therefore a NO-GO in its own class, even where a coarser
class could legitimately drift that far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from worker.quant.precision import PRECISION_CLASSES, PrecisionClass

DISTANCE_MARGIN = 10.0  # NMSE and KL thresholds: 10x the worst honest value
COSINE_DEFICIT_MARGIN = 2.0  # 1 - min_cosine: 2x the worst honest deficit
TOP1_SLACK = 0.05  # top-1 agreement: the worst honest value minus 5 points
# Floors stop a class whose fixtures happen to agree exactly (F32 vs F32) from getting a zero threshold
# that float summation order alone would break on another machine.
DISTANCE_FLOOR = 1e-6
COSINE_DEFICIT_FLOOR = 1e-5


class RuntimeThresholds(BaseModel):
    """Gate-2 thresholds for one precision class."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_cosine: float = Field(ge=-1, le=1)
    max_logits_nmse: float = Field(ge=0)
    max_kl_mean: float = Field(ge=0)
    max_kl_p99: float = Field(ge=0)
    min_top1_agreement: float = Field(ge=0, le=1)


@dataclass(frozen=True, slots=True)
class Honest:
    """The worst gate-2 values one honest conversion showed (embedding or causal-LM fields)."""

    fixture: str
    precision: PrecisionClass
    min_cosine: float | None = None
    nmse: float | None = None
    kl_mean: float | None = None
    kl_p99: float | None = None
    top1: float | None = None


# Measured with `python scripts/measure_thresholds.py` (llama-cpp-python 0.3.36 built with portable AVX2 flags,
# transformers 4.57, torch 2.13, CPU, examples/english.txt) on 2026-11-29. The class is the artifact's least
# precise matrix type, so a K-quant whose rows are not multiples of 256 (MiniLM's 384, Qwen3 fixture's 64)
# falls back to legacy types and lands in another class than its name says. Re-run after upgrading a runtime.
# The tiny llama has random weights, so its logits are nearly uniform: its KL is far below a trained model's
# and its top-1 agreement far worse. These defaults therefore err towards NO-GO for trained causal LMs;
# measure an honest conversion of your own catalogue and configure a named policy from it.
MEASURED: tuple[Honest, ...] = (
    Honest('minilm-F32', 'float', min_cosine=0.9999987),
    Honest('minilm-F16', 'float', min_cosine=0.9999986),
    Honest('minilm-BF16', 'float', min_cosine=0.9999822),
    Honest('minilm-Q8_0', '8bit', min_cosine=0.9993576),
    Honest('minilm-Q6_K', '6bit', min_cosine=0.9986834),
    Honest('minilm-Q5_0', '5bit', min_cosine=0.9899423),
    Honest('minilm-Q5_K_M', '5bit', min_cosine=0.9921104),
    Honest('minilm-Q4_0', '4bit', min_cosine=0.9481136),
    Honest('minilm-Q4_K_M', '4bit', min_cosine=0.9904901),
    Honest('minilm-Q3_K_M', '4bit', min_cosine=0.9658129),
    Honest('minilm-Q2_K', 'lower', min_cosine=0.9337337),
    Honest('tiny-qwen3-F32', 'float', min_cosine=0.9999999),
    Honest('tiny-qwen3-F16', 'float', min_cosine=0.9999998),
    Honest('tiny-qwen3-Q8_0', '8bit', min_cosine=0.999907),
    Honest('tiny-qwen3-Q6_K', '8bit', min_cosine=0.999907),
    Honest('tiny-qwen3-Q5_K_M', '5bit', min_cosine=0.9976034),
    Honest('tiny-qwen3-Q4_K_M', '5bit', min_cosine=0.9971158),
    Honest('tiny-qwen3-Q3_K_M', '4bit', min_cosine=0.9958133),
    Honest('tiny-llama-F32', 'float', nmse=7.68e-08, kl_mean=3.92e-09, kl_p99=7.6e-09, top1=1),
    Honest('tiny-llama-F16', 'float', nmse=4.84e-07, kl_mean=2.47e-08, kl_p99=3.26e-08, top1=0.981),
    Honest('tiny-llama-BF16', 'float', nmse=2.92e-05, kl_mean=1.49e-06, kl_p99=1.86e-06, top1=0.981),
    Honest('tiny-llama-Q8_0', '8bit', nmse=0.000294, kl_mean=1.5e-05, kl_p99=1.94e-05, top1=0.981),
    Honest('tiny-llama-Q6_K', '6bit', nmse=0.00213, kl_mean=0.000109, kl_p99=0.000141, top1=1),
    Honest('tiny-llama-Q5_0', '5bit', nmse=0.0093, kl_mean=0.000476, kl_p99=0.000699, top1=0.769),
    Honest('tiny-llama-Q5_K_M', '5bit', nmse=0.00739, kl_mean=0.000378, kl_p99=0.000494, top1=0.75),
    Honest('tiny-llama-Q4_0', '4bit', nmse=0.0335, kl_mean=0.00171, kl_p99=0.00253, top1=0.692),
    Honest('tiny-llama-Q4_K_M', '4bit', nmse=0.0241, kl_mean=0.00123, kl_p99=0.00163, top1=0.615),
    Honest('tiny-llama-Q3_K_M', 'lower', nmse=0.0444, kl_mean=0.00227, kl_p99=0.00326, top1=0.558),
    Honest('tiny-llama-Q2_K', 'lower', nmse=0.225, kl_mean=0.0115, kl_p99=0.0181, top1=0.231),
    # One-per-architecture fixtures (llama.cpp's F16 conversion and its Q8_0), measured on 2026-11-30 with
    # `scripts/measure_thresholds.py --architectures-only`; random weights again, so top-1 is the noisy figure.
    Honest('arch-llama-F16', 'float', nmse=2.96e-07, kl_mean=3.86e-09, kl_p99=7.78e-09, top1=1),
    Honest('arch-llama-Q8_0', '8bit', nmse=0.000151, kl_mean=1.97e-06, kl_p99=3.2e-06, top1=1),
    Honest('arch-mistral-F16', 'float', nmse=4.16e-07, kl_mean=1.08e-08, kl_p99=1.61e-08, top1=1),
    Honest('arch-mistral-Q8_0', '8bit', nmse=0.000258, kl_mean=6.71e-06, kl_p99=1.05e-05, top1=1),
    Honest('arch-qwen2-F16', 'float', nmse=2.97e-07, kl_mean=3.96e-09, kl_p99=6.88e-09, top1=1),
    Honest('arch-qwen2-Q8_0', '8bit', nmse=0.000162, kl_mean=2.16e-06, kl_p99=3.9e-06, top1=1),
    Honest('arch-qwen3moe-F16', 'float', nmse=4.44e-05, kl_mean=5.69e-07, kl_p99=1.39e-05, top1=1),
    Honest('arch-qwen3moe-Q8_0', '8bit', nmse=0.000308, kl_mean=3.95e-06, kl_p99=2.32e-05, top1=1),
    Honest('arch-gemma2-F16', 'float', nmse=9.39e-07, kl_mean=1.2e-08, kl_p99=2.49e-08, top1=1),
    Honest('arch-gemma2-Q8_0', '8bit', nmse=0.000448, kl_mean=5.74e-06, kl_p99=1.18e-05, top1=0.943),
    Honest('arch-gemma3-F16', 'float', nmse=1.42e-06, kl_mean=1.81e-08, kl_p99=3.82e-08, top1=1),
    Honest('arch-gemma3-Q8_0', '8bit', nmse=0.000787, kl_mean=1e-05, kl_p99=1.73e-05, top1=0.943),
    Honest('arch-phi3-F16', 'float', nmse=3.19e-07, kl_mean=4.05e-09, kl_p99=8.18e-09, top1=1),
    Honest('arch-phi3-Q8_0', '8bit', nmse=0.000189, kl_mean=2.4e-06, kl_p99=4.73e-06, top1=0.942),
    Honest('arch-xlm-roberta-F16', 'float', min_cosine=1),
    Honest('arch-xlm-roberta-Q8_0', '8bit', min_cosine=1),
)


def _worst(precision: PrecisionClass, field: str, lowest: bool) -> float:
    values = [getattr(m, field) for m in MEASURED if m.precision == precision and getattr(m, field) is not None]
    if not values:
        raise ValueError(f"no honest {field} measured for precision class {precision!r}")
    return min(values) if lowest else max(values)


def round_outward(value: float, up: bool) -> float:
    """Two significant digits, rounded away from strictness (a threshold is never tighter than derived)."""
    if value <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(value)) - 1)
    return float(f"{(math.ceil if up else math.floor)(value / scale) * scale:.2g}")


def derive(precision: PrecisionClass) -> RuntimeThresholds:
    """Thresholds for one class from `MEASURED` and the margins above."""
    def distance(field: str) -> float:
        return round_outward(max(_worst(precision, field, lowest=False) * DISTANCE_MARGIN, DISTANCE_FLOOR), up=True)

    deficit = max(1.0 - _worst(precision, "min_cosine", lowest=True), 0.0) * COSINE_DEFICIT_MARGIN
    return RuntimeThresholds(
        min_cosine=round(1.0 - round_outward(max(deficit, COSINE_DEFICIT_FLOOR), up=True), 12),
        max_logits_nmse=distance("nmse"), max_kl_mean=distance("kl_mean"), max_kl_p99=distance("kl_p99"),
        min_top1_agreement=round(round_outward(max(_worst(precision, "top1", lowest=True) - TOP1_SLACK, 0.0), up=False),
                                 12),
    )


def _no_tighter_than(previous: RuntimeThresholds, current: RuntimeThresholds) -> RuntimeThresholds:
    """A coarser class is never held tighter than a finer one (its fixtures may just have been lucky)."""
    return RuntimeThresholds(
        min_cosine=min(previous.min_cosine, current.min_cosine),
        max_logits_nmse=max(previous.max_logits_nmse, current.max_logits_nmse),
        max_kl_mean=max(previous.max_kl_mean, current.max_kl_mean),
        max_kl_p99=max(previous.max_kl_p99, current.max_kl_p99),
        min_top1_agreement=min(previous.min_top1_agreement, current.min_top1_agreement),
    )


def default_thresholds() -> dict[PrecisionClass, RuntimeThresholds]:
    out: dict[PrecisionClass, RuntimeThresholds] = {}
    previous: RuntimeThresholds | None = None
    for name in PRECISION_CLASSES:
        current = derive(name)
        out[name] = previous = current if previous is None else _no_tighter_than(previous, current)
    return out


DEFAULT_RUNTIME_THRESHOLDS = default_thresholds()
