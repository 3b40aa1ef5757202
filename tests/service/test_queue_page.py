"""The operator page in real headless Chromium (Debian's package), driven over the DevTools protocol
as a person would use it: sign in with the form, see the queue refresh in place, and the screenshot
shows the styled table. The token never appears in a URL; the cookie is Secure, HttpOnly, Strict.
Each active row names the model, submitter, wait and run times and Kueue position; the recent finished
rows show verdict, first blocker or failure reason and link to the report, which a click opens."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.api.app import create_app, no_loops
from service.auth import Role
from service.lifecycle import State
from service.persistence import repository
from service.persistence.db import make_engine, session_factory, transaction
from tests.service.cdp import Browser
from tests.service.conftest import add_token, settings_for, start_server
from tests.service.seeding import seed
from tests.service.test_exports import report

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


HOSTILE = 'file:///m/"><script>window.pwned = 1</script>'


def finish(session, verification_id: str, verdict: str, blockers: tuple[str, ...] = ()) -> None:
    attempt = repository.claim(session, verification_id, "w").attempt
    repository.start_attempt(session, verification_id, "w", attempt=attempt)
    assert repository.record_verdict(session, verification_id, attempt, report(verdict, "d" * 64, blockers),
                                     worker="w")


@pytest.fixture
def server(sqlite_url, tmp_path):
    """Two queued (one pending in Kueue at position 2), one running; finished: a GO, a NO-GO with two
    blockers and a hostile source, and a failure with its reason."""
    engine = make_engine(sqlite_url)
    ids = {}
    with transaction(session_factory(engine)) as session:
        for i in range(3):
            verification = seed(
                session, submitted_by="alice", idempotency_key=f"k{i}", request_sha256="r" * 64, request=REQUEST,
                policy={}, policy_sha256="p" * 64, max_attempts=3)
            ids[f"queued{i}"] = verification.id
        repository.record_cluster_status(session, repository.get_verification(session, ids["queued1"]),
                                         "pending in ClusterQueue cq", 2)
        attempt = repository.claim(session, verification.id, "local:test:1/abc").attempt
        repository.start_attempt(session, verification.id, "local:test:1/abc", attempt=attempt)
        repository.heartbeat(session, verification.id, attempt, {"stage": "storage", "done": 40, "total": 101},
                             worker="local:test:1/abc")
        for name, submitter, request in (("go", "bob", REQUEST | {"artifact_uri": "hf://org/m@x/go-model.gguf"}),
                                         ("nogo", "mallory", REQUEST | {"source_uri": HOSTILE}),
                                         ("failed", "carol", REQUEST)):
            ids[name] = seed(
                session, submitted_by=submitter, idempotency_key=name, request_sha256="r" * 64, request=request,
                policy={}, policy_sha256="p" * 64, max_attempts=1).id
        finish(session, ids["go"], "GO")
        finish(session, ids["nogo"], "NO-GO", ("tokenizer.ids_mismatch", "embedding.cosine_below_threshold"))
        attempt = repository.claim(session, ids["failed"], "w").attempt
        repository.start_attempt(session, ids["failed"], "w", attempt=attempt)
        assert repository.fail_permanently(session, ids["failed"], attempt, "source <b>unreadable</b>", worker="w")
    engine.dispose()
    for live in start_server(settings_for(sqlite_url, tmp_path)):
        live.ids = ids
        yield live


def test_queue_page_renders_refreshes_and_looks_right(server, sqlite_url, tmp_path):
    token = add_token(sqlite_url, Role.OPERATOR)
    with Browser(tmp_path) as browser:
        browser.sign_in(f"{server.url}/ui/queue", token)
        assert browser.url() == f"{server.url}/ui/queue"  # the token is in no URL the browser visited
        browser.wait_for("Number(document.querySelector('.snapshot').dataset.rendered)"
                         " > Number(document.body.dataset.rendered)")  # the table was refreshed in place
        dom = browser.dom()
        cookie = browser.cookie("convgate_token")
        assert (cookie["secure"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (
            True, True, "Strict", "/ui")
        assert token not in "".join(browser.history())
        shot = tmp_path / "queue.png"
        browser.screenshot(shot)
    assert "convgate — verification queue" in dom
    assert re.search(r"queued: <b>2</b>", dom) and re.search(r"running: <b>1</b>", dom)
    assert re.search(r"completed: <b>2</b>", dom) and re.search(r"failed: <b>1</b>", dom)
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


def cells(browser: Browser, table: str) -> list[dict[str, str]]:
    """Each row of `table` (#active or #finished) as {column header: cell text}."""
    return browser.evaluate(f"""(() => {{
        const table = document.querySelector('table#{table}');
        const heads = [...table.querySelectorAll('th')].map(th => th.textContent.trim());
        return [...table.querySelectorAll('tbody tr')].map(tr => Object.fromEntries(
            [...tr.querySelectorAll('td')].map((td, i) => [heads[i], td.textContent.trim()])));
    }})()""")


def test_operator_page_shows_who_what_how_long_and_recent_verdicts(server, sqlite_url, tmp_path):
    token = add_token(sqlite_url, Role.OPERATOR)
    with Browser(tmp_path) as browser:
        browser.sign_in(f"{server.url}/ui/queue", token)
        browser.wait_for("document.querySelector('table#finished') !== null")
        active, finished = cells(browser, "active"), cells(browser, "finished")
        assert browser.evaluate("window.pwned === undefined && document.scripts.length === 1")
        dom = browser.dom()
        by_id = {row["id"]: row for row in active}
        assert set(by_id) == {server.ids[f"queued{i}"][:8] for i in range(3)}
        pending = by_id[server.ids["queued1"][:8]]
        assert pending["Kueue"] == "pending in ClusterQueue cq #2"
        running = by_id[server.ids["queued2"][:8]]
        assert (running["model"], running["submitter"], running["state"]) == ("m.gguf file:///m", "alice", "running")
        assert re.fullmatch(r"\d+s", running["waited"]) and re.fullmatch(r"\d+s", running["ran"])
        assert pending["ran"] == "" and re.fullmatch(r"\d+s", pending["waited"])
        assert [row["id"] for row in finished] == [server.ids[name][:8] for name in ("failed", "nogo", "go")]
        failed, nogo, go = finished
        assert (go["model"], go["submitter"], go["outcome"], go["first blocker"]) == (
            "go-model.gguf file:///m", "bob", "GO", "")
        assert (nogo["outcome"], nogo["first blocker"], nogo["submitter"]) == (
            "NO-GO", "tokenizer.ids_mismatch", "mallory")
        assert nogo["model"] == "m.gguf " + HOSTILE
        assert (failed["outcome"], failed["reason"], failed["report"]) == ("failed", "source <b>unreadable</b>", "")
        assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in dom and "source &lt;b&gt;unreadable" in dom
        browser.evaluate(f"document.querySelector('a[href=\"/ui/verifications/{server.ids['nogo']}/report\"]')"
                         ".click(); true")
        browser.wait_for(f"document.title === 'convgate {server.ids['nogo']}'")
        report_dom = browser.dom()
    assert "NO-GO" in report_dom and "tokenizer.ids_mismatch" in report_dom
    assert "<b>tokenizer.ids_mismatch</b>" not in report_dom  # the report's own text is escaped too


@pytest.fixture(params=["sqlite", "postgres"])
def database(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")


def test_queue_json_and_table_on_both_databases(database, tmp_path):
    """GET /v1/queue carries what the page shows; the table escapes the hostile source and reason."""
    app = create_app(settings_for(database, tmp_path), loops=no_loops)
    with TestClient(app) as client, transaction(app.state.session_factory) as session:
        request = REQUEST | {"source_uri": HOSTILE, "artifact_uri": "hf://org/repo@x/model-q8_0.gguf"}
        waiting = seed(
            session, submitted_by="pipeline-7", idempotency_key="w", request_sha256="r" * 64, request=request,
            policy={}, policy_sha256="p" * 64, max_attempts=3)
        repository.record_cluster_status(session, waiting, "<i>pending</i>", 4)
        done = seed(
            session, submitted_by="pipeline-8", idempotency_key="d", request_sha256="r" * 64, request=request,
            policy={}, policy_sha256="p" * 64, max_attempts=3)
        finish(session, done.id, "NO-GO", ("gguf.offset_misaligned",))
    headers = {"Authorization": f"Bearer {add_token(database, Role.OPERATOR)}"}
    with TestClient(app) as client:
        item = client.get("/v1/queue", headers=headers).json()["active"][0]
        table = client.get("/ui/queue/table", headers=headers).text
    assert (item["submitted_by"], item["artifact_uri"], item["source_uri"]) == (
        "pipeline-7", request["artifact_uri"], HOSTILE)
    assert item["wait_seconds"] >= 0 and item["run_seconds"] is None and item["queue_position"] == 4
    assert "<script>" not in table and "<i>pending" not in table and "&lt;i&gt;pending&lt;/i&gt; #4" in table
    assert ">model-q8_0.gguf</span>" in table and "<td>pipeline-7</td>" in table
    finished = re.search(r'<table id="finished">.*?</table>', table, re.S)[0]
    assert done.id[:8] in finished and "<code>gguf.offset_misaligned</code>" in finished
    assert f'href="/ui/verifications/{done.id}/report"' in finished and "pipeline-8" in finished


def test_recent_finished_are_the_latest_to_finish_of_every_end_state(database):
    """Finished out of submission order: the list follows finishing; each end state is read, the active
    ones are not, and the first blocker is the report's first, not the alphabetically first."""
    from service.persistence.recent import recent_finished

    engine = make_engine(database)
    with transaction(session_factory(engine)) as session:
        ids = {name: seed(
            session, submitted_by="p", idempotency_key=name, request_sha256="r" * 64, request=REQUEST, policy={},
            policy_sha256="p" * 64, max_attempts=1).id for name in ("go", "nogo", "failed", "cancelled", "queued")}
        finish(session, ids["nogo"], "NO-GO", ("tokenizer.ids_mismatch", "embedding.cosine_below_threshold"))
        attempt = repository.claim(session, ids["failed"], "w").attempt
        repository.start_attempt(session, ids["failed"], "w", attempt=attempt)
        assert repository.fail_permanently(session, ids["failed"], attempt, "unreadable", worker="w")
        finish(session, ids["go"], "GO")
        repository.cancel(session, ids["cancelled"], "op")
    with transaction(session_factory(engine)) as session:
        rows = recent_finished(session)
        assert [row.id for row in rows] == [ids[n] for n in ("cancelled", "go", "failed", "nogo")]
        assert [(row.verdict_result, row.first_blocker, row.reason) for row in rows] == [
            (None, None, "cancelled by op"), ("GO", None, None), (None, None, "unreadable"),
            ("NO-GO", "tokenizer.ids_mismatch", None)]
        assert [row.id for row in recent_finished(session, limit=2)] == [ids["cancelled"], ids["go"]]
        newest_submitted = recent_finished(session, per_state=1)  # of the two completed, the later submitted
        assert [row.id for row in newest_submitted] == [ids[n] for n in ("cancelled", "failed", "nogo")]
    engine.dispose()
