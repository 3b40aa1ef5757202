"""The compute-noise bound's pieces (engine/gates/runtime/compute_noise.py): which files are probed, which
blockers ask for it, how far a measured noise widens a threshold, and the rounding itself (one row of a
batch rounded, every other row exact)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.blockers import Blocker
from engine.gates.runtime.compute_noise import (
    NOISE_MARGIN,
    PROBE_POSITIONS,
    ComputeNoise,
    measure_noise,
    needs_probe,
    rounding_of,
)
from engine.gates.runtime.logit_math import compare_rows
from engine.runtime.activation_rounding import rounded_linear_inputs
from engine.thresholds import DEFAULT_RUNTIME_THRESHOLDS


@pytest.mark.parametrize(("classes", "rounded"), [
    (("f16",), "float16"), (("bf16",), "bfloat16"), (("f16", "bf16"), "bfloat16"), (("f32", "f16"), "float16"),
    (("f32",), None), (("f16", "q8_0"), None), (("q8_k",), None), ((), None)])
def test_only_float_files_with_a_rounded_class_are_probed(classes, rounded) -> None:
    assert rounding_of(classes) == rounded


def _blocker(code: str) -> Blocker:
    return Blocker(code=code, gate="runtime", why="x")


def test_only_a_distance_blocker_asks_for_the_probe() -> None:
    assert needs_probe([_blocker("logits.nmse_above_threshold")], "float16")
    assert needs_probe([_blocker("logits.top1_below_threshold"), _blocker("logits.kl_above_threshold")], "float16")
    assert not needs_probe([_blocker("logits.top1_below_threshold"), _blocker("logits.not_finite")], "float16")
    assert not needs_probe([_blocker("logits.nmse_above_threshold")], None)
    assert not needs_probe([], "float16")


def test_a_threshold_widens_to_the_margin_times_the_noise_and_never_narrows() -> None:
    f16 = DEFAULT_RUNTIME_THRESHOLDS["f16"]
    loud = ComputeNoise("float16", 64, nmse=1e-5, kl_mean=2e-5, kl_p99=float("nan")).widened(f16)
    nmse = NOISE_MARGIN["nmse"] * 1e-5
    assert nmse * (1 - 1e-12) <= loud.max_logits_nmse <= nmse * 1.1  # rounded outward to two digits
    assert loud.max_kl_mean >= NOISE_MARGIN["kl_mean"] * 2e-5 * (1 - 1e-12) > f16.max_kl_mean
    assert loud.max_kl_p99 == f16.max_kl_p99  # a figure that is not finite widens nothing
    assert (loud.min_top1_agreement, loud.tie_margin, loud.min_cosine) == (
        f16.min_top1_agreement, f16.tie_margin, f16.min_cosine)
    quiet = ComputeNoise("float16", 64, nmse=1e-12, kl_mean=0.0, kl_p99=1e-12).widened(f16)
    assert quiet == f16


def test_each_distance_widens_by_its_own_margin_rounded_outward() -> None:
    f16 = DEFAULT_RUNTIME_THRESHOLDS["f16"]
    widened = ComputeNoise("float16", 64, nmse=1.234e-5, kl_mean=1.234e-5, kl_p99=1.234e-4).widened(f16)
    assert widened.max_logits_nmse == 0.00051  # 41 x 1.234e-5 = 5.06e-4, up to two digits
    assert widened.max_kl_mean == 0.00033  # 26 x 1.234e-5 = 3.21e-4
    assert widened.max_kl_p99 == 0.0051  # 41 x 1.234e-4 = 5.06e-3


def test_the_details_name_the_rounding_and_the_thresholds_it_led_to() -> None:
    noise = ComputeNoise("bfloat16", 32, nmse=1e-3, kl_mean=1e-3, kl_p99=1e-2)
    widened = noise.widened(DEFAULT_RUNTIME_THRESHOLDS["bf16"])
    details = noise.details(widened)
    assert details == {"why": "a distance exceeded the class threshold: this model's own sensitivity to its class's "
                              "rounding was measured, and each distance threshold is at least noise_margin times it",
                       "rounded_to": "bfloat16", "positions": 32, "nmse": 1e-3, "kl_mean": 1e-3, "kl_p99": 1e-2,
                       "noise_margin": NOISE_MARGIN, "thresholds": widened.model_dump()}
    assert math.isfinite(details["thresholds"]["max_kl_p99"])


def test_only_the_chosen_row_of_every_linear_input_is_rounded() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x = torch.randn(2, 3, 8) * 1.234567
    x[1] = x[0]
    with torch.inference_mode():
        exact = model(x)
        with rounded_linear_inputs(model, torch.float16, row=1):
            rounded = model(x)
        after = model(x)
    assert torch.equal(rounded[0], exact[0])
    assert not torch.equal(rounded[1], exact[1])
    first = model[0](x[1].to(torch.float16).to(torch.float32))
    expected = model[2](torch.relu(first).to(torch.float16).to(torch.float32))
    assert torch.equal(rounded[1], expected)
    assert torch.equal(after, exact)  # the hooks are gone


class _StandIn:
    """What measure_noise asks of the reference: the exact and rounded hidden states of one sequence, and the
    head applied to rows of them (here a fixed matrix)."""

    def __init__(self, hidden: int = 4, vocabulary: int = 6) -> None:
        rng = np.random.default_rng(0)
        self.weight = rng.normal(size=(hidden, vocabulary)).astype(np.float32)
        self.asked: list[tuple[list[int], str]] = []

    def rounding_pair(self, ids: list[int], dtype_name: str) -> tuple[np.ndarray, np.ndarray]:
        self.asked.append((ids, dtype_name))
        exact = np.arange(len(ids) * 4, dtype=np.float32).reshape(len(ids), 4) / 7
        return exact, (exact * 1.001).astype(np.float32)

    def head(self, hidden: np.ndarray) -> np.ndarray:
        return hidden @ self.weight


def test_the_noise_is_the_distance_between_exact_and_rounded_logits_over_the_first_positions() -> None:
    model = _StandIn()
    noise = measure_noise(model, list(range(300)), "bfloat16", vocabulary=6)  # type: ignore[arg-type]
    assert model.asked == [(list(range(PROBE_POSITIONS)), "bfloat16")]
    exact, rounded = (model.head(side).astype(np.float64) for side in model.rounding_pair(list(range(128)), "x"))
    assert noise.positions == PROBE_POSITIONS and noise.rounded_to == "bfloat16"
    assert noise.nmse == pytest.approx(((rounded - exact) ** 2).sum() / (exact**2).sum(), rel=1e-9)
    kl = compare_rows(exact, rounded).kl
    assert noise.kl_mean == pytest.approx(kl.mean(), rel=1e-9)
    assert noise.kl_p99 == pytest.approx(np.percentile(kl, 99), rel=1e-9) and noise.kl_p99 < kl.max()


def test_logits_that_are_all_zero_have_no_finite_nmse() -> None:
    model = _StandIn()
    model.weight[:] = 0
    noise = measure_noise(model, list(range(8)), "float16", vocabulary=6)  # type: ignore[arg-type]
    assert noise.nmse == float("inf") and noise.kl_mean == 0


def test_a_big_vocabulary_probes_as_many_positions_as_one_logits_block_holds_and_never_fewer_than_two() -> None:
    model = _StandIn()
    assert measure_noise(model, list(range(300)), "float16", vocabulary=262_144).positions == 64  # type: ignore[arg-type]
    assert measure_noise(model, list(range(300)), "float16", vocabulary=1 << 30).positions == 2  # type: ignore[arg-type]
    assert measure_noise(model, [5], "float16", vocabulary=6).positions == 1  # type: ignore[arg-type]
