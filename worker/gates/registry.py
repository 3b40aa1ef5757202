"""The gates, registered in the order they run. A new gate is a package under `worker/gates/` holding its checks
and an object meeting `worker.gates.contract.Gate`, one line here, and its name in `worker.blockers.GateName`
(the report's schema names its gates): the engine and the negative controls read this table, at each run."""

from __future__ import annotations

from worker.gates.contract import Gate
from worker.gates.release.gate import RELEASE
from worker.gates.runtime.gate import RUNTIME
from worker.gates.storage.gate import STORAGE

GATES: tuple[Gate, ...] = (STORAGE, RUNTIME, RELEASE)


def requested(numbers: frozenset[int]) -> tuple[Gate, ...]:
    """The registered gates among `numbers`, in the order they run."""
    return tuple(gate for gate in GATES if gate.number in numbers)
