"""Negative controls: each gate that ran must fail on a copy of this artifact's measurements with one
planted defect, before a GO is trusted."""

from worker.controls.run import ControlInputs, run_controls, undetected

__all__ = ["ControlInputs", "run_controls", "undetected"]
