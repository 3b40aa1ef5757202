"""The gate registry is the one place the engine and the controls learn which gates exist: gates run in its
order, only when requested, the first pod runs every gate and the others only those that run in every shard,
and each gate's outcome and negative controls reach the report. Shown with stand-in gates on a real
(tiny-llama) artifact, so the engine's own checks before the gates (digest, structure, source) run for real."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

import pytest

from engine.blockers import Blocker, GateName
from engine.controls.planted import Planted
from engine.gates import registry
from engine.gates.contract import ControlInputs, GateContext, GateOutcome, Plant
from engine.progress import no_progress
from engine.report import GateResult
from engine.verification import LocalInputs, VerifyRequest, verify, verify_shard
from tests.conftest import SUITE_POLICY

pytestmark = pytest.mark.slow


def test_the_registry_holds_the_three_gates_in_number_order() -> None:
    assert [(gate.number, gate.name) for gate in registry.GATES] == [(1, "storage"), (2, "runtime"), (3, "release")]
    assert {gate.name for gate in registry.GATES} == set(get_args(GateName))
    assert [gate.every_shard for gate in registry.GATES] == [True, False, False]
    assert [gate.number for gate in registry.requested(frozenset({3, 1}))] == [1, 3]


@dataclass
class StandIn:
    """A gate that records its runs and plants one control that its own check detects."""

    number: int
    name: GateName
    every_shard: bool = False
    libraries: tuple[str, ...] = ()
    ran: list[int] = field(default_factory=list)  # the shard of each run
    planted: int = 0

    def run(self, context: GateContext) -> GateOutcome:
        self.ran.append(context.shard)
        result = GateResult(name=self.name, status="failed" if self.number == 3 else "passed", seconds=0.5,
                            details={"shard": context.shard})
        blockers = [Blocker(code="release.file_changed", gate="release", why="stand-in")] if self.number == 3 else []
        return GateOutcome(result=result, blockers=blockers, not_verified=[f"{self.name}: stand-in note"])

    def plants(self, inputs: ControlInputs) -> list[Plant]:
        def plant() -> list[Planted]:
            self.planted += 1
            return [Planted(check=f"{self.name} check", defect="stand-in defect", detected_by=("stand.in",))]
        return [plant]


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> tuple[StandIn, ...]:
    gates = (StandIn(1, "storage", every_shard=True), StandIn(2, "runtime"), StandIn(3, "release"))
    monkeypatch.setattr(registry, "GATES", gates)
    return gates


def test_only_the_requested_gates_run_in_order_and_each_outcome_reaches_the_report(tiny_llama, stand_ins) -> None:
    inputs = LocalInputs(source=tiny_llama / "source", artifact=tiny_llama / "tiny-llama-F16.gguf")
    report = verify(VerifyRequest(gates=frozenset({1, 3})), inputs, SUITE_POLICY)
    storage, runtime, release = stand_ins
    assert (storage.ran, runtime.ran, release.ran) == ([0], [], [0])
    assert list(report.gates) == ["storage", "release"]
    assert report.timings["release"] == 0.5
    assert [blocker.code for blocker in report.blockers] == ["release.file_changed"]
    assert {"gate 2 (runtime) was not requested", "storage: stand-in note", "release: stand-in note"} <= set(
        report.not_verified)
    assert [control.gate for control in report.controls] == ["storage", "release"]  # each gate that ran
    assert (storage.planted, runtime.planted, release.planted) == (1, 0, 1)


def test_a_later_shard_runs_only_the_gates_that_run_in_every_shard(tiny_llama, stand_ins) -> None:
    inputs = LocalInputs(source=tiny_llama / "source", artifact=tiny_llama / "tiny-llama-F16.gguf")
    report, part = verify_shard(VerifyRequest(), inputs, SUITE_POLICY, no_progress, 1, 2)
    storage, runtime, release = stand_ins
    assert (storage.ran, runtime.ran, release.ran) == ([1], [], [])
    assert list(report.gates) == ["storage"] and part is None
    assert report.controls == []  # controls are the first pod's, over the merged verification


def _library_of(gate: StandIn, name: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module `name` holding `code`, importable and not yet imported, named as `gate`'s one library."""
    (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    gate.libraries = (name,)


def test_a_later_gates_libraries_are_imported_on_a_thread_while_the_first_gate_runs(
        tiny_llama, stand_ins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gate 2's torch and transformers take seconds to import from a cold page cache: the engine imports
    them (each gate's `libraries`) beside gate 1, so they are loaded when gate 2 starts."""
    storage, runtime, _ = stand_ins
    _library_of(runtime, "convgate_warm_probe", "import threading\nIMPORTED_BY = threading.current_thread().name\n",
                tmp_path, monkeypatch)
    seen: list[str] = []
    first_run = storage.run

    def waiting_run(context: GateContext) -> GateOutcome:
        deadline = time.monotonic() + 10
        while "convgate_warm_probe" not in sys.modules and time.monotonic() < deadline:
            time.sleep(0.01)
        module = sys.modules.get("convgate_warm_probe")
        seen.append(getattr(module, "IMPORTED_BY", "not imported while gate 1 ran"))
        return first_run(context)

    storage.run = waiting_run  # type: ignore[method-assign]
    inputs = LocalInputs(source=tiny_llama / "source", artifact=tiny_llama / "tiny-llama-F16.gguf")
    verify(VerifyRequest(gates=frozenset({1, 2})), inputs, SUITE_POLICY)
    assert seen and seen[0] not in ("not imported while gate 1 ran", threading.current_thread().name), seen


def test_the_libraries_are_imported_before_the_gate_that_needs_them_starts(
        tiny_llama, stand_ins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate never imports a library while the warm-up thread is still importing it: transformers' lazy
    module answered `from transformers import AutoModel` with an ImportError beside another thread's import,
    and gate 2 reported transformers missing. The first gate here ends at once; the import takes 0.5 s."""
    _, runtime, _ = stand_ins
    _library_of(runtime, "convgate_slow_probe", "import time\ntime.sleep(0.5)\nDONE = True\n", tmp_path, monkeypatch)
    seen: list[bool] = []
    second_run = runtime.run

    def checking_run(context: GateContext) -> GateOutcome:
        seen.append(getattr(sys.modules.get("convgate_slow_probe"), "DONE", False))
        return second_run(context)

    runtime.run = checking_run  # type: ignore[method-assign]
    inputs = LocalInputs(source=tiny_llama / "source", artifact=tiny_llama / "tiny-llama-F16.gguf")
    verify(VerifyRequest(gates=frozenset({1, 2})), inputs, SUITE_POLICY)
    assert seen == [True]


def test_a_first_gate_that_raises_leaves_no_import_running(
        tiny_llama, stand_ins, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first gate that fails with an exception ends the verification, but the process goes on (a local pool
    worker takes the next one, whose gate 2 imports transformers): the warm-up import must be over by then, or
    that import runs beside it (the ImportError above). The error still reaches the caller unchanged."""
    storage, runtime, _ = stand_ins
    _library_of(runtime, "convgate_raised_probe", "import time\ntime.sleep(0.5)\n", tmp_path, monkeypatch)

    def failing_run(context: GateContext) -> GateOutcome:
        raise RuntimeError("gate 1 crashed")

    storage.run = failing_run  # type: ignore[method-assign]
    inputs = LocalInputs(source=tiny_llama / "source", artifact=tiny_llama / "tiny-llama-F16.gguf")
    with pytest.raises(RuntimeError, match="gate 1 crashed"):
        verify(VerifyRequest(gates=frozenset({1, 2})), inputs, SUITE_POLICY)
    assert [thread.name for thread in threading.enumerate() if thread.name == "convgate-warm-imports"] == []
