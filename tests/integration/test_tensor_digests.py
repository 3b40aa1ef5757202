"""Every gate-1 tensor row carries the sha256 of that tensor's stored bytes, so a recipient of the
report (or of its attestation) can check the file tensor by tensor, whatever the header's order -
in a run on one pod and in a run split over shards alike."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.digests import sha256_file
from engine.formats.gguf_structure import read_layout
from engine.policy import Policy
from engine.progress import no_progress
from engine.verification import LocalInputs, VerifyRequest, merge_shards, verify_shard
from tests.conftest import run_gate1

pytestmark = pytest.mark.slow


def stored_digests(artifact: Path) -> dict[str, str]:
    """Each tensor's sha256, read independently of the gate (plain file reads at the header's offsets)."""
    layout = read_layout(artifact)
    with artifact.open("rb") as handle:
        digests = {}
        for info in layout.tensors:
            handle.seek(info.offset)
            digests[info.name] = hashlib.sha256(handle.read(info.nbytes)).hexdigest()
    return digests


@pytest.mark.parametrize("gguf_type", ["F16", "Q8_0", "Q4_K_M"])
def test_every_tensor_row_names_the_sha256_of_its_stored_bytes(minilm, gguf_type):
    artifact = minilm / f"minilm-{gguf_type}.gguf"
    rows = run_gate1(minilm / "source", artifact).gates["storage"].details["tensors"]
    expected = stored_digests(artifact)
    assert {row["gguf_name"]: row["data_sha256"] for row in rows} == expected
    assert len(set(expected.values())) > 1  # digests of different bytes, not one constant


def test_shards_carry_the_digests_through_the_merge(minilm):
    artifact = minilm / "minilm-Q8_0.gguf"
    request = VerifyRequest(gates=frozenset({1}), expected_sha256=sha256_file(artifact))
    inputs = LocalInputs(source=minilm / "source", artifact=artifact)
    outcomes = [verify_shard(request, inputs, Policy(), no_progress, shard, 3) for shard in range(3)]
    parts = [part for _, part in outcomes if part is not None]
    assert len(parts) == 3 and all(pair.row and pair.row.data_sha256 for part in parts for pair in part.checked)
    merged = merge_shards(outcomes[0][0], parts, Policy())
    rows = merged.gates["storage"].details["tensors"]
    assert {row["gguf_name"]: row["data_sha256"] for row in rows} == stored_digests(artifact)
