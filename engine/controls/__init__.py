"""Negative controls: each gate that ran must fail on a copy of this artifact's measurements with one
planted defect, before a GO is trusted. `planted.py` is what a control found; `run.py` times every registered
gate's controls; the controls themselves live with their gate (`engine/gates/<gate>/controls.py`)."""
