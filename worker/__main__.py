"""`python -m worker` runs the convgate CLI."""

from worker.cli import app

app()
