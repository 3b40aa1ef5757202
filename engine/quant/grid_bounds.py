"""Per-element bounds for the vector-codebook types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S.

These quantizers (vendor/llama.cpp/ggml/src/ggml-quants.c, quantize_row_iq*_impl) choose each sub-block's
scale by a weighted least-squares fit whose weights come from the importance matrix, which the verifier
may not have; with zero or extreme weights an element's error is not bounded by the scale. What *does*
follow from the construction for every importance matrix and input precision, read from the stored
block (gguf-py's dequantized values w_hat) and the candidate input x:

* Signs (derived). IQ2_S and IQ3_S store every element's sign as the sign of x (`xb >= 0`), so no
  element may have w_hat of the opposite sign (IQ3_S's quantizer does not advance its sign and grid
  pointers past an all-zero sub-block, so after one the signs of the following sub-blocks sit one
  slot early: `_lagging_sign_source` reproduces that). IQ2_XXS, IQ2_XS and IQ3_XXS store 7 signs per group of 8
  and make the count of negatives even by flipping the element with the smallest weight*x^2: at most
  one element per group of 8 disagrees with x. The "scale < 0" branch ("should never happen"; possible
  with extreme weights, since the flipped element enters the fit negated) negates a whole sub-block, so
  a sub-block may instead agree with -x under the same rule. A sub-block the quantizer skipped
  (max|x| below its GROUP_MAX_EPS, or a zero least-squares scale) stores grid point 0 with no signs,
  so it reads as one repeated value: a sub-block whose values are all equal is exempt.
* Magnitude (derived, except IQ1_M). With q >= q_min in the fit's units and x <= X = max|x| of the
  256-element super-block, the fitted scale is sum(w*x*q)/sum(w*q^2) <= X/q_min; the stored sub-scale
  rounds (2l+1)*d to at most scale + d with d = max_scale/N; so |w_hat| <= K*X:
  IQ2_*: 43/8 * (1 + 1/31) = 5.548 (grid magnitudes 8, 25, 43; IQ2_S's d fudge 0.9875 only lowers it);
  IQ3_XXS: 1.0125 * 62/4 * (1 + 1/31) = 16.2; IQ3_S: 1.033 * 15 * (1 + 1/31) = 16.0;
  IQ1_S: 1.125 (d fudge) * 1.125 (max |grid + delta|) * 8 (1/q_min, q_min = delta = 1/8) * (1 + 1/15) = 10.8.
  IQ1_M refits its super-scale over the whole super-block, which only gives 150*X; its K = 30 is
  MEASURED instead: the largest max|w_hat|/X over about 7,000 libggml quantizations (Gaussian, Laplace,
  uniform and outlier rows, some scaled by 1e-4 into fp16-subnormal scales; f32/f16/bf16 inputs; no,
  uniform, lognormal sigma 1-4, 50%/90%/97%-sparse, one-hot and adversarial importance weights that
  weigh only the smallest or the largest values) was 15.6, reached with 90%-sparse weights; 30 is that
  with a margin of about 1.9.

An element that breaks either rule gets bound 0 (any difference exceeds it); every other element gets
|x| + K*X, which |x - w_hat| <= |x| + |w_hat| and the cap imply (a sign that agrees gives no tighter
bound that the cap does not already enforce).
"""

from __future__ import annotations

import numpy as np

from engine.formats.ggml_types import GGMLType
from engine.quant import reference

SUPER_BLOCK = 256
SIGN_GROUP = 8
# type -> (magnitude factor K, sub-block with one fitted scale, signs: None / "exact" / "lagging" / "parity")
GRID_RULES: dict[str, tuple[float, int, str | None]] = {
    "IQ2_XXS": (5.548, 32, "parity"),
    "IQ2_XS": (5.548, 16, "parity"),
    "IQ2_S": (5.548, 16, "exact"),
    "IQ3_XXS": (16.2, 32, "parity"),
    "IQ3_S": (16.0, 32, "lagging"),
    "IQ1_S": (10.8, 32, None),
    "IQ1_M": (30.0, 16, None),
}
RELATIVE_SLACK = 2.0**-9  # fp16 rounding of d (2^-11) and float32 arithmetic in the fit, generously
ABSOLUTE_SLACK = 2.0**-25 * 512  # a subnormal fp16 d rounds by up to 2^-25, times (2l+1)*max grid value


def _wrong_signs(reference_x: np.ndarray, w_hat: np.ndarray, allowed: int) -> np.ndarray:
    """[sub-block, element] True for each element disagreeing in sign with `reference_x` in a group of 8
    holding more than `allowed` such elements (a zero on either side never disagrees)."""
    wrong = ((reference_x > 0) & (w_hat < 0)) | ((reference_x < 0) & (w_hat > 0))
    per_group = wrong.reshape(wrong.shape[0], -1, SIGN_GROUP)
    over = per_group.sum(axis=2, keepdims=True) > allowed
    return (per_group & over).reshape(wrong.shape)


def _lagging_sign_source(x: np.ndarray) -> np.ndarray:
    """[sub-block, element]: the values whose signs IQ3_S stores in each sub-block's slot. Its quantizer
    skips an all-zero sub-block without advancing its sign pointer, so the slots of a 256-block hold the
    signs of its non-zero sub-blocks in order, and the slots left at the end stay 0 (positive)."""
    blocks = x.reshape(-1, SUPER_BLOCK // x.shape[1], x.shape[1])
    nonzero = (blocks != 0).any(axis=2)
    order = np.argsort(~nonzero, axis=1, kind="stable")
    shifted = np.take_along_axis(blocks, order[:, :, None], axis=1)
    unwritten = np.arange(blocks.shape[1])[None, :] >= nonzero.sum(axis=1, keepdims=True)
    return np.where(unwritten[:, :, None], 1.0, shifted).reshape(x.shape)


def _sign_faults(x: np.ndarray, w_hat: np.ndarray, signs: str) -> np.ndarray:
    """[sub-block, element] True where an element's sign breaks the type's rule (see the module doc)."""
    if signs == "lagging":
        return _wrong_signs(_lagging_sign_source(x), w_hat, 0)
    found = _wrong_signs(x, w_hat, 0 if signs == "exact" else 1)
    if signs == "parity":  # the "scale < 0" branch negates every sign of the sub-block
        found &= _wrong_signs(-x, w_hat, 1).any(axis=1, keepdims=True)
    skipped = (w_hat == w_hat[:, :1]).all(axis=1, keepdims=True)
    return found & ~skipped


def grid_bounds(raw_rows: np.ndarray, ggml_type: GGMLType, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """One per-element bound array per candidate quantizer input (the source rows at one precision)."""
    factor, sub_block, signs = GRID_RULES[ggml_type.name]
    w_hat = reference.dequantize(np.asarray(raw_rows), ggml_type).astype(np.float64).reshape(-1, SUPER_BLOCK)
    found = []
    for x_rows in inputs:
        x = x_rows.astype(np.float64).reshape(-1, SUPER_BLOCK)
        cap = factor * np.abs(x).max(axis=1, keepdims=True) * (1 + RELATIVE_SLACK) + ABSOLUTE_SLACK
        broken = np.abs(w_hat) > cap
        if signs is not None:
            by_sub_block = _sign_faults(x.reshape(-1, sub_block), w_hat.reshape(-1, sub_block), signs)
            broken |= by_sub_block.reshape(x.shape)
        found.append(np.where(broken, 0.0, np.abs(x) + cap).reshape(x_rows.shape))
    return found


def grid_description(ggml_type: GGMLType) -> str:
    factor, _, signs = GRID_RULES[ggml_type.name]
    text = f"|w_hat| <= {factor}*max|x| of its 256-block"
    if signs in ("exact", "lagging"):
        return text + "; sign(w_hat) = sign(w)"
    if signs == "parity":
        return text + "; sign(w_hat) = sign(w) but for at most one element per 8 (or all negated per sub-block)"
    return text
