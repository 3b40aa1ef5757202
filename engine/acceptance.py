"""The one place the policy may let gate 2 vouch for quants that do not reproduce for a non-defect reason.

`tensor.not_reproduced` (an imatrix quant given without its imatrix) and `tensor.other_quantizer`
(a systematic difference from the quantizer we carry) are not defects, but they are not proof of
an honest file either: the bytes were not reproduced. The default policy keeps them NO-GO. With
`"gate2"` for the code, they are accepted only when *every other* blocker is absent (so the
per-type bounds and both readers held on every tensor) and gate 2 was requested, ran and passed:
the model's logits or embeddings then match the reference within the policy's thresholds. An
accepted blocker is not dropped silently: it becomes a line of the report's `not_verified`.
"""

from __future__ import annotations

from engine.blockers import Blocker
from engine.policy import Policy
from engine.report import GateResult

POLICY_FIELD = {"tensor.not_reproduced": "without_imatrix", "tensor.other_quantizer": "other_quantizer"}


def accept_unreproduced(blockers: list[Blocker], gates: dict[str, GateResult],
                        policy: Policy) -> tuple[list[Blocker], list[str]]:
    """(blockers that remain, not-verified notes for those the policy accepted on gate 2's evidence)."""
    runtime = gates.get("runtime")
    if runtime is None or runtime.status != "passed" or not blockers:
        return blockers, []
    acceptable = [b for b in blockers if b.code in POLICY_FIELD and getattr(policy, POLICY_FIELD[b.code]) == "gate2"]
    if len(acceptable) != len(blockers):
        return blockers, []
    notes = [f"bytes not reproduced, accepted by policy on gate 2's measurements: {b.why}"
             + (f" ({b.tensor})" if b.tensor else "") for b in acceptable]
    return [], notes
