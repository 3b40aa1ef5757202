"""Gate 3 — release: the exact published file re-measured, as a consumer would load it. `gate.py` is its entry
point and registration."""
