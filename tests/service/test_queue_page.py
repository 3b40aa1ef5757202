"""The operator page in real headless Chromium (Debian's package): it renders the queue, refreshes
it in place, and the screenshot shows the styled table."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from service.auth import Role
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from service.states import State
from tests.service.conftest import add_token, settings_for, start_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--window-size=1200,700"]
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium package is not installed")
REQUEST = {"source_uri": "file:///m", "artifact_uri": "file:///m.gguf", "artifact_sha256": "d" * 64}


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.fixture
def server(sqlite_url, tmp_path):
    engine = make_engine(sqlite_url)
    with transaction(session_factory(engine)) as session:
        for i in range(3):
            verification = repository.insert_verification(
                session, submitted_by="alice", idempotency_key=f"k{i}", request_sha256="r" * 64, request=REQUEST,
                policy={}, policy_sha256="p" * 64, max_attempts=3)
        repository.start_attempt(session, verification.id, "local:test:1/abc")
        repository.heartbeat(session, verification.id, 1, {"stage": "storage", "done": 40, "total": 101})
    engine.dispose()
    yield from start_server(settings_for(sqlite_url, tmp_path))


def test_queue_page_renders_refreshes_and_looks_right(server, sqlite_url, tmp_path):
    token = add_token(sqlite_url, Role.OPERATOR)
    url = f"{server.url}/ui/queue?token={token}"
    dom = chromium(tmp_path, "--virtual-time-budget=6000", "--dump-dom", url).stdout
    assert "convgate — verification queue" in dom
    assert re.search(r"queued: <b>2</b>", dom) and re.search(r"running: <b>1</b>", dom)
    assert "<progress value=\"40\" max=\"101\"></progress> storage" in dom
    page_time = int(re.search(r'<body data-rendered="(\d+)"', dom)[1])
    table_time = int(re.search(r'class="snapshot" data-rendered="(\d+)"', dom)[1])
    assert table_time > page_time, "the table was not refreshed in place"
    assert token not in dom

    shot = tmp_path / "queue.png"
    chromium(tmp_path, f"--screenshot={shot}", url)
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 700)
    colours = {image.getpixel((x, y)) for x in range(0, 1200, 2) for y in range(0, 700, 2)}
    assert (238, 241, 246) in colours, "count badges are not drawn"
    assert any(abs(r - 11) + abs(g - 110) + abs(b - 46) < 60 for r, g, b in colours), "no running row in green"
    assert len(colours) > 50, "the page looks blank"


def test_queue_page_refuses_non_operators(server, sqlite_url, tmp_path):
    token = add_token(sqlite_url, Role.AUDITOR)
    dom = chromium(tmp_path, "--dump-dom", f"{server.url}/ui/queue?token={token}").stdout
    assert "forbidden" in dom and "verification queue" not in dom
    assert State.QUEUED.value not in dom
