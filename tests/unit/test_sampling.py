"""Sampled K-quant reproduction rests on one fact, checked here for every sampled type: a super-block
re-quantized on its own (with its own columns' importance weights) gives the bytes the whole row gives.
And the sample is a pure function of (artifact digest, tensor name, fraction)."""

from __future__ import annotations

import numpy as np
import pytest

from worker.formats.ggml_types import GGML_TYPES_BY_NAME
from worker.formats.gguf_structure import TensorInfo
from worker.gates.reproduction import reproduce_chunk
from worker.quant import reference
from worker.quant.sampling import SAMPLED_TYPES, block_sample, detection_probability, sampled

pytestmark = pytest.mark.slow  # libggml
SEED = "ab" * 32


def _rows(seed: int, rows: int = 6, width: int = 1024) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, width)).astype(np.float32) * 0.02
    x[:, rng.integers(width, size=4)] *= 25  # outlier columns, as real weights have
    return x


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "imatrix"])
@pytest.mark.parametrize("type_name", sorted(SAMPLED_TYPES))
def test_a_sample_of_blocks_reproduces_like_the_whole_row(type_name, weighted):
    ggml_type = GGML_TYPES_BY_NAME[type_name]
    x = _rows(len(type_name))
    weights = np.random.default_rng(3).lognormal(size=x.shape[1]).astype(np.float32) if weighted else None
    raw = reference.quantize(x, ggml_type, quant_weights=weights)
    info = TensorInfo("blk.0.ffn_up.weight", (x.shape[1], x.shape[0]), ggml_type, 0, raw.nbytes)
    sample = block_sample(SEED, info.name, raw.size // ggml_type.type_size, 0.5)
    outcome = reproduce_chunk(x, raw, info, 0, weights, sample)
    assert (outcome.mismatched, outcome.compared) == (0, int(sample.sum()))
    broken = raw.copy().reshape(-1, ggml_type.type_size)
    picked, skipped = np.nonzero(sample)[0][0], np.nonzero(~sample)[0][0]
    broken[picked, -1] ^= 0x11
    broken[skipped, -1] ^= 0x11  # outside the sample: not re-quantized, not counted
    outcome = reproduce_chunk(x, broken.reshape(raw.shape), info, 0, weights, sample)
    assert outcome.mismatched == 1


def test_the_sample_is_drawn_from_the_digest_and_the_tensor():
    first = block_sample(SEED, "blk.0.attn_q.weight", 10_000, 0.1)
    assert np.array_equal(first, block_sample(SEED, "blk.0.attn_q.weight", 10_000, 0.1))
    assert not np.array_equal(first, block_sample("cd" * 32, "blk.0.attn_q.weight", 10_000, 0.1))
    assert not np.array_equal(first, block_sample(SEED, "blk.1.attn_q.weight", 10_000, 0.1))
    assert 800 < first.sum() < 1200


def test_every_tensor_keeps_at_least_one_block():
    assert block_sample(SEED, "tiny", 3, 1e-9).sum() == 1


def test_detection_probability():
    assert detection_probability(0.1, 1) == pytest.approx(0.1)
    assert detection_probability(0.1, 10) == pytest.approx(1 - 0.9**10)
    assert detection_probability(1.0, 1) == 1.0


def test_only_k_quants_are_sampled_and_only_below_one():
    assert sampled("Q4_K", 0.25) and not sampled("Q4_K", 1.0)
    assert not sampled("Q8_0", 0.25) and not sampled("IQ4_XS", 0.25)
