"""Sampled K-quant reproduction rests on one fact, checked here for every sampled type: a super-block
re-quantized on its own (with its own columns' importance weights) gives the bytes the whole row gives.
And the sample is a pure function of (artifact digest, tensor name, fraction)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.gates.storage.reproduction import reproduce_chunk
from engine.quant import reference
from engine.quant.sampling import SAMPLED_TYPES, block_sample, detection_probability, sampled

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


def test_anyone_can_redraw_the_sample_from_the_documented_recipe():
    """The report promises an auditor can redraw which blocks were read: numpy's default generator seeded
    with [the first 128 bits of the artifact's sha256, crc32 of the tensor's name], one float32 uniform
    per super-block, kept below the fraction. Written out here as that recipe, not as the code's call."""
    import zlib

    for name, fraction in (("blk.0.attn_q.weight", 0.1), ("output.weight", 0.5)):
        generator = np.random.default_rng([int(SEED[:32], 16), zlib.crc32(name.encode())])
        expected = generator.random(4096, dtype=np.float32) < np.float32(fraction)
        assert np.array_equal(block_sample(SEED, name, 4096, fraction), expected)
    assert int(SEED[:33], 16) != int(SEED[:32], 16)  # the redraw depends on exactly 32 hex digits


def test_the_report_names_the_fraction_seed_types_and_probabilities():
    from engine.quant.sampling import sampling_details

    details = sampling_details(0.25, SEED, 3, 12)
    assert details == {"fraction": 0.25, "seed": SEED, "types": ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"],
                       "super_blocks_reproduced": 3, "super_blocks_total": 12,
                       "detection_probability": {"1": 0.25, "10": round(1 - 0.75**10, 6),
                                                 "100": round(1 - 0.75**100, 6)}}
