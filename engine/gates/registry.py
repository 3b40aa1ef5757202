"""The gates, registered in the order they run. A new gate is a package under `engine/gates/` holding its checks
and an object meeting `engine.gates.contract.Gate`, one line here, and its name in `engine.blockers.GateName`
(the report's schema names its gates): the engine and the negative controls read this table, at each run."""

from __future__ import annotations

from engine.gates.contract import Gate
from engine.gates.release.gate import RELEASE
from engine.gates.runtime.gate import RUNTIME
from engine.gates.storage.gate import STORAGE

GATES: tuple[Gate, ...] = (STORAGE, RUNTIME, RELEASE)


def requested(numbers: frozenset[int]) -> tuple[Gate, ...]:
    """The registered gates among `numbers`, in the order they run."""
    return tuple(gate for gate in GATES if gate.number in numbers)
