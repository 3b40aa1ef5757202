"""Gate 1 — storage: every tensor of the artifact against its source, bit for bit, reproduced or bounded, and
every GGUF key against what the source implies. `gate.py` is its entry point and registration."""
