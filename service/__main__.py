"""`python -m service` is the `convgate` command (for a Python whose scripts are not on PATH)."""

from service.cli import app

app()
