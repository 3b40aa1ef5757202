"""Gate 1 split into shards (what an Indexed Job's pods each run): every shard's part merged gives the
very report one worker gives, defects, systematic reclassification and gates 2-3 included; parts
that do not fit together are refused, never half-merged."""

from __future__ import annotations

import pytest

from engine.gates.storage.parts import MergeError, assign
from engine.policy import Policy
from engine.progress import no_progress
from engine.verification import LocalInputs, VerifyRequest, merge_shards, verify, verify_shard
from tests.conftest import SUITE_POLICY, defect_copy

pytestmark = pytest.mark.slow


def _comparable(report) -> dict:
    document = report.model_dump(mode="json")
    document.pop("timings")
    document.pop("environment")
    for control in document["controls"]:
        control.pop("seconds")
    for gate in document["gates"].values():
        gate.pop("seconds")
        gate["details"].pop("shards", None)
        # why gate 2 ran its passes is the process's own account: shard 0 has not seen every tensor's
        # gate-1 row, one worker has (the count of passes stays compared)
        gate["details"].get("reference", {}).pop("passes_why", None)
    return document


def _sharded(request, inputs, shards, policy=None):
    policy = policy or SUITE_POLICY
    outcomes = [verify_shard(request, inputs, policy, no_progress, shard, shards) for shard in range(shards)]
    return merge_shards(outcomes[0][0], [part for _, part in outcomes], policy), outcomes


def _moved_rows(raw):
    values = raw.view("<f4")
    values[:] = values.reshape(384, 384).T.copy().reshape(-1)


@pytest.mark.parametrize("shards", [2, 3])
def test_merged_shards_equal_one_worker_with_defects(minilm, tmp_path, shards):
    artifact = defect_copy(minilm / "minilm-F32.gguf", tmp_path, "blk.0.attn_q.weight", _moved_rows)
    artifact = defect_copy(artifact, tmp_path, "blk.5.ffn_down.weight", lambda raw: raw.view("<f4").__setitem__(7, 3.0))
    request, inputs = VerifyRequest(gates=frozenset({1})), LocalInputs(source=minilm / "source", artifact=artifact)
    merged, outcomes = _sharded(request, inputs, shards)
    whole = verify(request, inputs, SUITE_POLICY)
    assert _comparable(merged) == _comparable(whole)
    assert merged.verdict == "NO-GO"
    assert [b.tensor for b in merged.blockers] == ["blk.0.attn_q.weight", "blk.5.ffn_down.weight"]
    assert merged.gates["storage"].details["shards"]["count"] == shards
    checked = [len(part.checked) for _, part in outcomes]
    assert sum(checked) == 101 and all(count > 0 for count in checked)


def test_merged_shards_equal_one_worker_through_gates_2_and_3(minilm):
    request = VerifyRequest(gates=frozenset({1, 2, 3}), texts=("a short text", "another one about models"))
    inputs = LocalInputs(source=minilm / "source", artifact=minilm / "minilm-Q8_0.gguf")
    merged, outcomes = _sharded(request, inputs, 2)
    assert merged.verdict == "GO", merged.blockers
    assert set(outcomes[1][0].gates) == set()  # only shard 0 runs gates 2 and 3
    assert _comparable(merged) == _comparable(verify(request, inputs, SUITE_POLICY))


def test_a_systematic_difference_is_judged_over_every_shard(imatrix_fixture, tiny_llama):
    """Without its imatrix, every weighted tensor differs: tensor.not_reproduced per type, whatever the split."""
    request = VerifyRequest(gates=frozenset({1}))
    inputs = LocalInputs(source=tiny_llama / "source", artifact=imatrix_fixture / "tiny-llama-Q4_K_M-imat.gguf")
    merged, _ = _sharded(request, inputs, 3)
    assert {b.code for b in merged.blockers} == {"tensor.not_reproduced"}  # one per quant type
    assert _comparable(merged) == _comparable(verify(request, inputs, SUITE_POLICY))


def test_parts_that_do_not_fit_are_refused(minilm, tmp_path):
    request = VerifyRequest(gates=frozenset({1}))
    inputs = LocalInputs(source=minilm / "source", artifact=minilm / "minilm-Q8_0.gguf")
    outcomes = [verify_shard(request, inputs, Policy(), no_progress, shard, 2) for shard in range(2)]
    head, part0, part1 = outcomes[0][0], outcomes[0][1], outcomes[1][1]
    with pytest.raises(MergeError, match=r"expected parts 0\.\.1"):
        merge_shards(head, [part0], Policy())
    with pytest.raises(MergeError, match=r"expected parts 0\.\.1"):
        merge_shards(head, [part0, part0], Policy())
    other = LocalInputs(source=minilm / "source", artifact=minilm / "minilm-F16.gguf")
    foreign = verify_shard(request, other, Policy(), no_progress, 1, 2)[1]
    with pytest.raises(MergeError, match="different artifacts"):
        merge_shards(head, [part0, foreign], Policy())
    lossy = part1.model_copy(update={"checked": part1.checked[1:]})
    with pytest.raises(MergeError, match="every tensor exactly once"):
        merge_shards(head, [part0, lossy], Policy())


def test_assignment_is_balanced_and_deterministic():
    weights = [100, 1, 50, 50, 1, 1, 30, 20]
    owners = assign(weights, 2)
    assert owners == assign(weights, 2)
    loads = sorted(sum(w for w, o in zip(weights, owners, strict=True) if o == shard) for shard in range(2))
    assert loads == [123, 130]  # largest first to the least loaded: 100+30 and 50+50+20+1+1+1
    assert sorted(set(assign(weights, 3))) == [0, 1, 2]
    assert assign(weights, 1) == [0] * len(weights)
