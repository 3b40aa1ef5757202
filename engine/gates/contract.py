"""What a gate is: a number, a name, a run over the verification's context, and the negative controls that
prove its comparisons can fail on this very artifact.

The engine and the controls loop over the registered gates (`engine/gates/registry.py`) instead of asking
"is gate 2 requested?" in two places, so adding a gate is one package and one registration. A gate reads the
context (the request, the opened files, what earlier gates measured) and answers with a `GateOutcome`; the
engine alone records outcomes into the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engine.blockers import Blocker, GateName
from engine.controls.planted import Planted
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import SourceModel
from engine.gates.runtime.measures import RuntimeMeasurements
from engine.gates.storage.parts import StoragePart
from engine.policy import Policy
from engine.progress import Progress
from engine.quant.imatrix import ImportanceMatrix
from engine.report import FileDigest, GateResult
from engine.request import LocalInputs, VerifyRequest

Plant = Callable[[], list[Planted]]  # one timed negative control: plants defects, returns what each raised


@dataclass(kw_only=True)
class GateContext:
    """One verification as the gates see it: validated files, the request, and what earlier gates measured
    (`part`: gate 1's tensors checked in this process; `measured`: gate 2's measurements), which later gates
    read (gate 2 reuses gate 1's proof of equal weights; gate 3 re-measures gate 2's results)."""

    request: VerifyRequest
    inputs: LocalInputs
    policy: Policy
    progress: Progress
    pieces: list[FileDigest]  # the artifact's files as digested: one, or every shard of a split
    layout: GGUFLayout
    source: SourceModel
    imatrix: ImportanceMatrix | None = None
    imatrix_file: FileDigest | None = None
    shard: int = 0
    shards: int = 1
    part: StoragePart | None = None
    measured: RuntimeMeasurements | None = None

    @property
    def artifact(self) -> Path:
        return self.inputs.artifact

    @property
    def artifact_sha256(self) -> str:
        return self.pieces[0].sha256


@dataclass(kw_only=True)
class GateOutcome:
    """What one gate's run adds to the report. `result` is None for a part of gate 1 that is merged later."""

    result: GateResult | None = None
    blockers: list[Blocker] = field(default_factory=list)
    not_verified: list[str] = field(default_factory=list)
    package_files: list[FileDigest] = field(default_factory=list)  # release files besides the artifact's own


@dataclass(frozen=True, kw_only=True)
class ControlInputs:
    """What the gates measured, as the engine holds it after running them: what the controls plant into."""

    artifact: Path
    artifact_sha256: str
    layout: GGUFLayout
    source: SourceModel
    policy: Policy
    imatrix: ImportanceMatrix | None = None
    runtime: RuntimeMeasurements | None = None  # gate 2's measurements, when it measured anything
    gates_run: frozenset[str] = frozenset()  # names of the gates that ran ("storage", "runtime", "release")


class Gate(Protocol):
    """A gate: registered once in `engine/gates/registry.py`, run by the engine in number order."""

    number: int
    name: GateName
    every_shard: bool  # runs in every pod of a verification split over pods (gate 1's parts), not only the first
    libraries: tuple[str, ...]  # modules its run imports: imported on a thread while an earlier gate runs

    def run(self, context: GateContext) -> GateOutcome:
        """Measure, judge, and say what was not verified; record what later gates read into `context`."""
        ...

    def plants(self, inputs: ControlInputs) -> list[Plant]:
        """The negative controls of this gate, one per comparison it ran, each timed on its own."""
        ...
