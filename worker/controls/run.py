"""The negative controls of one run: before a GO is trusted, every gate that ran must fail on a copy of this
very artifact's measurements with one planted defect. A control that passes becomes a blocker."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from worker.blockers import Blocker
from worker.controls.planted import Planted, not_applicable
from worker.formats.gguf_structure import GGUFLayout
from worker.formats.source import SourceModel
from worker.gates.release.controls import release_control
from worker.gates.runtime.controls import embedding_control, logits_control, tokenizer_control
from worker.gates.runtime.gate import RuntimeMeasurements
from worker.gates.storage.controls import storage_controls
from worker.policy import Policy
from worker.quant.imatrix import ImportanceMatrix
from worker.report import Control


@dataclass(frozen=True, kw_only=True)
class ControlInputs:
    """What the gates measured, as the engine holds it after running them."""

    artifact: Path
    artifact_sha256: str
    layout: GGUFLayout
    source: SourceModel
    policy: Policy
    imatrix: ImportanceMatrix | None = None
    runtime: RuntimeMeasurements | None = None  # gate 2's measurements, when it measured anything
    gates_run: frozenset[str] = frozenset()  # names of the gates that ran ("storage", "runtime", "release")


def _timed(gate: str, plant: Callable[[], list[Planted]]) -> list[Control]:
    """Run one gate's plants; they share the seconds they took together (choosing the tensors is shared work)."""
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


def _storage_plants(inputs: ControlInputs) -> list[Planted]:
    return storage_controls(inputs.artifact, inputs.layout, inputs.source, inputs.policy, inputs.imatrix,
                            inputs.artifact_sha256)


def _runtime_plants(inputs: ControlInputs) -> list[Callable[[], list[Planted]]]:
    """One plant per comparison gate 2 ran, each timed (and failing) on its own."""
    evidence = inputs.runtime.evidence if inputs.runtime else None
    if evidence is None:
        return [lambda: [not_applicable("runtime", "gate 2 measured nothing to plant a defect in")]]
    texts, plants = evidence.texts, []
    if (tokenizer := evidence.tokenizer) is not None:
        plants.append(lambda: [tokenizer_control(texts, tokenizer)])
    if (embeddings := evidence.embeddings) is not None:
        plants.append(lambda: [embedding_control(texts, embeddings)])
    if (logits := evidence.logits) is not None:
        plants.append(lambda: [logits_control(texts, logits)])
    return plants


def run_controls(inputs: ControlInputs) -> list[Control]:
    """The controls of every gate that ran, in gate order."""
    controls: list[Control] = []
    if "storage" in inputs.gates_run:
        controls += _timed("storage", lambda: _storage_plants(inputs))
    if "runtime" in inputs.gates_run:
        for plant in _runtime_plants(inputs):
            controls += _timed("runtime", plant)
    if "release" in inputs.gates_run:
        controls += _timed("release", lambda: [release_control(inputs.artifact, inputs.artifact_sha256)])
    return controls


def undetected(controls: list[Control]) -> list[Blocker]:
    """The blockers of controls whose planted defect passed: the ruler could not have failed."""
    return [Blocker(code="verifier.control_not_detected", gate="verifier",
                    why=f"{control.defect} at {control.location} (planted in memory) passed gate {control.gate}'s "
                        f"{control.check} comparison: its passes on this artifact cannot be trusted")
            for control in controls if control.outcome == "not_detected"]
