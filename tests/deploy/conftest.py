"""The service tests' SQLite database fixture, for the test that runs a real verification before it
scrapes /metrics (test_monitoring_names.py)."""

from tests.service.conftest import sqlite_url  # noqa: F401
