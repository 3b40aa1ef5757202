"""Fuzz targets, one per parser of untrusted input (run with scripts/fuzz.py; corpus replayed in tests/fuzz)."""
