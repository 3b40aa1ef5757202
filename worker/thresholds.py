"""Gate-2 thresholds per precision class, derived from measured honest conversions.

Each class's numbers come from the worst value measured on honest conversions of the fixtures in
that class (`scripts/measure_thresholds.py` re-measures and prints this table), widened by a stated
margin, never narrowed. Distances (NMSE, KL) get a multiplicative margin, cosine a multiplicative
margin on its deficit (1 - cosine), top-1 agreement an absolute slack. A defect that moves a file
a thousand times its honest distance is therefore a NO-GO in its own class, even where a coarser
class could legitimately drift that far.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from worker.quant.precision import PRECISION_CLASSES, PrecisionClass

DISTANCE_MARGIN = 20.0  # NMSE and KL thresholds: 20x the worst honest value
COSINE_DEFICIT_MARGIN = 3.0  # 1 - min_cosine: 3x the worst honest deficit
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


# Measured with `python scripts/measure_thresholds.py` (llama-cpp-python 0.3.x, transformers 4.57, torch 2.13,
# CPU, the README's English text set). Re-run it after upgrading either runtime.
MEASURED: tuple[Honest, ...] = ()


def _worst(precision: PrecisionClass, field: str, lowest: bool) -> float:
    values = [getattr(m, field) for m in MEASURED if m.precision == precision and getattr(m, field) is not None]
    if not values:
        raise ValueError(f"no honest {field} measured for precision class {precision!r}")
    return min(values) if lowest else max(values)


def derive(precision: PrecisionClass) -> RuntimeThresholds:
    """Thresholds for one class from `MEASURED` and the margins above."""
    def distance(field: str) -> float:
        return max(_worst(precision, field, lowest=False) * DISTANCE_MARGIN, DISTANCE_FLOOR)

    deficit = max(1.0 - _worst(precision, "min_cosine", lowest=True), 0.0) * COSINE_DEFICIT_MARGIN
    return RuntimeThresholds(
        min_cosine=1.0 - max(deficit, COSINE_DEFICIT_FLOOR),
        max_logits_nmse=distance("nmse"), max_kl_mean=distance("kl_mean"), max_kl_p99=distance("kl_p99"),
        min_top1_agreement=max(_worst(precision, "top1", lowest=True) - TOP1_SLACK, 0.0),
    )


DEFAULT_RUNTIME_THRESHOLDS: dict[PrecisionClass, RuntimeThresholds] = {
    name: derive(name) for name in PRECISION_CLASSES
} if MEASURED else {}
