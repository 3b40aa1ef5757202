"""The negative controls of one run: before a GO is trusted, every gate that ran must fail on a copy of this
very artifact's measurements with one planted defect. A control that passes becomes a blocker. Each gate
says which controls it has (`Gate.plants`); this loop times them and writes them into the report."""

from __future__ import annotations

import time

from engine.blockers import Blocker
from engine.controls.planted import Planted
from engine.gates import registry
from engine.gates.contract import ControlInputs, Plant
from engine.report import Control

__all__ = ["ControlInputs", "run_controls", "undetected"]


def _timed(gate: str, plant: Plant) -> list[Control]:
    """Run one plant; its defects share the seconds they took together (choosing the tensors is shared work)."""
    started = time.perf_counter()
    try:
        found = plant()
    except (KeyError, IndexError, ValueError, RuntimeError, OSError) as exc:  # a control that cannot run proves nothing
        found = [Planted(check=gate, defect="a control that could not run", detected_by=(),
                         why=f"{type(exc).__name__}: {str(exc)[:200]}")]
    seconds = (time.perf_counter() - started) / len(found)
    return [Control(gate=gate, check=planted.check, defect=planted.defect, location=planted.location,
                    outcome=planted.outcome, detected_by=list(planted.detected_by or ()), why=planted.why,
                    seconds=seconds) for planted in found]


def run_controls(inputs: ControlInputs) -> list[Control]:
    """The controls of every gate that ran, in gate order."""
    return [control for gate in registry.GATES if gate.name in inputs.gates_run
            for plant in gate.plants(inputs) for control in _timed(gate.name, plant)]


def undetected(controls: list[Control]) -> list[Blocker]:
    """The blockers of controls whose planted defect passed: the ruler could not have failed."""
    return [Blocker(code="verifier.control_not_detected", gate="verifier",
                    why=f"{control.defect} at {control.location} (planted in memory) passed gate {control.gate}'s "
                        f"{control.check} comparison: its passes on this artifact cannot be trusted")
            for control in controls if control.outcome == "not_detected"]
