"""The operator page in real headless Chromium (Debian's package), driven over the DevTools protocol
as a person would use it: sign in with the form, see the queue refresh in place, and the screenshot
shows the styled table. The token never appears in a URL; the cookie is Secure, HttpOnly, Strict."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from service.auth import Role
from service.lifecycle import State
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.cdp import Browser
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
        attempt = repository.claim(session, verification.id, "local:test:1/abc").attempt
        repository.start_attempt(session, verification.id, "local:test:1/abc", attempt=attempt)
        repository.heartbeat(session, verification.id, attempt, {"stage": "storage", "done": 40, "total": 101},
                             worker="local:test:1/abc")
    engine.dispose()
    yield from start_server(settings_for(sqlite_url, tmp_path))


def test_queue_page_renders_refreshes_and_looks_right(server, sqlite_url, tmp_path):
    token = add_token(sqlite_url, Role.OPERATOR)
    with Browser(tmp_path) as browser:
        browser.sign_in(f"{server.url}/ui/queue", token)
        assert browser.url() == f"{server.url}/ui/queue"  # the token is in no URL the browser visited
        time.sleep(3)  # two refreshes of the table
        dom = browser.dom()
        cookie = browser.cookie("convgate_token")
        assert (cookie["secure"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (
            True, True, "Strict", "/ui")
        assert token not in "".join(browser.history())
        shot = tmp_path / "queue.png"
        browser.screenshot(shot)
    assert "convgate — verification queue" in dom
    assert re.search(r"queued: <b>2</b>", dom) and re.search(r"running: <b>1</b>", dom)
    assert "<progress value=\"40\" max=\"101\"></progress> storage" in dom
    page_time = int(re.search(r'<body data-rendered="(\d+)"', dom)[1])
    table_time = int(re.search(r'class="snapshot" data-rendered="(\d+)"', dom)[1])
    assert table_time > page_time, "the table was not refreshed in place"
    assert token not in dom
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 700)
    colours = {image.getpixel((x, y)) for x in range(0, 1200, 2) for y in range(0, 700, 2)}
    assert (238, 241, 246) in colours, "count badges are not drawn"
    assert any(abs(r - 11) + abs(g - 110) + abs(b - 46) < 60 for r, g, b in colours), "no running row in green"
    assert len(colours) > 50, "the page looks blank"


def test_queue_page_refuses_non_operators(server, sqlite_url, tmp_path):
    token = add_token(sqlite_url, Role.AUDITOR)
    with Browser(tmp_path) as browser:
        browser.sign_in(f"{server.url}/ui/queue", token)
        dom = browser.dom()
        assert browser.cookie("convgate_token") is None
    assert "may not see the queue" in dom and "verification queue" not in dom
    assert f"{State.QUEUED.value}: <b>" not in dom


def test_a_token_in_the_url_is_ignored(server, sqlite_url, tmp_path):
    token = add_token(sqlite_url, Role.OPERATOR)
    dom = chromium(tmp_path, "--dump-dom", f"{server.url}/ui/queue?token={token}").stdout
    assert "sign in" in dom and "verification queue" not in dom
