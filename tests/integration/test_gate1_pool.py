"""Gate 1 spread over processes: the same report whatever the number of processes, and the pool is
what a large model on a multi-CPU pod actually gets."""

from __future__ import annotations

import numpy as np
import pytest

from engine.formats.gguf_structure import read_layout
from engine.formats.source import open_source
from engine.gates.architectures import architecture_for
from engine.gates.inventory import take_inventory
from engine.gates.storage import value_checks
from engine.gates.storage.value_checks import check_values
from engine.policy import Policy
from engine.progress import no_progress
from tests.conftest import defect_copy, run_gate1

pytestmark = pytest.mark.slow


def _values(artifact, source_dir, processes):
    layout, source = read_layout(artifact), open_source(source_dir)
    pairs = take_inventory(architecture_for("bert", source.config), layout, source).pairs
    outcomes = check_values(artifact, layout, source.root, pairs, Policy(), no_progress, None, processes=processes)
    rows = [outcome.row.model_dump() for outcome in outcomes if outcome.row is not None]
    blockers = [blocker.model_dump() for outcome in outcomes for blocker in outcome.blockers]
    return rows, blockers, sum(outcome.weighted for outcome in outcomes)


def _two_defects(raw_q: np.ndarray) -> None:
    values = raw_q.view("<f4")
    values[:] = values.reshape(384, 384).T.copy().reshape(-1)


def test_pool_and_serial_give_the_same_rows_and_blockers_in_the_same_order(minilm, tmp_path):
    artifact = defect_copy(minilm / "minilm-F32.gguf", tmp_path, "blk.0.attn_q.weight", _two_defects)
    artifact = defect_copy(artifact, tmp_path, "blk.5.ffn_down.weight",
                           lambda raw: raw.view("<f4").__setitem__(7, np.float32(3.0)))
    serial = _values(artifact, minilm / "source", 1)
    pooled = _values(artifact, minilm / "source", 2)
    assert pooled == serial
    rows, blockers, _ = serial
    assert len(rows) == 101
    assert [blocker["tensor"] for blocker in blockers] == ["blk.0.attn_q.weight", "blk.5.ffn_down.weight"]


def test_quantized_tensors_reproduce_in_pool_processes(minilm):
    serial = _values(minilm / "minilm-Q4_K_M.gguf", minilm / "source", 1)
    pooled = _values(minilm / "minilm-Q4_K_M.gguf", minilm / "source", 2)
    assert pooled == serial
    assert not pooled[1]
    assert {row["check"] for row in pooled[0]} == {"bit-exact", "reproduced"}


def test_a_large_model_on_a_multi_cpu_pod_gets_the_pool(minilm, monkeypatch):
    """The storage gate itself chooses the pool from the CPU budget and the model's size."""
    started = []
    original = value_checks._in_pool

    def counting(job, layout, pairs, chosen, processes):
        started.append(processes)
        return original(job, layout, pairs, chosen, processes)

    monkeypatch.setattr(value_checks, "_in_pool", counting)
    monkeypatch.setattr(value_checks, "PARALLEL_MIN_WEIGHTS", 1)
    monkeypatch.setenv("CONVGATE_THREADS", "2")
    pooled = run_gate1(minilm / "source", minilm / "minilm-Q8_0.gguf")
    monkeypatch.setenv("CONVGATE_THREADS", "1")
    serial = run_gate1(minilm / "source", minilm / "minilm-Q8_0.gguf")
    assert started == [2]
    assert pooled.verdict == serial.verdict == "GO"
    assert pooled.gates["storage"].details == serial.gates["storage"].details
