"""The auditor page and the pages' report, attestation and export links, on Postgres and on the embedded
default (SQLite): over HTTP with the page's own sign-in, and in real headless Chromium as an auditor
would use it (search by sha256, narrow by verdict, open a report, download an attestation and the
export). Every value on the page is escaped: a source URI carrying a script runs nothing."""

from __future__ import annotations

import html
import json
import re
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app, no_loops
from service.attestations import PAYLOAD_TYPE, trusted_public_keys, verify_envelope
from service.auth import Role
from tests.service.cdp import Browser
from tests.service.conftest import add_token, settings_for, start_server
from tests.service.test_exports import SHA_A, SHA_B, seed

HOSTILE = 'file:///models/"><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


@pytest.fixture(params=["sqlite", "postgres"])
def database(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg")


def seeded(factory) -> dict[str, str]:
    return {
        "a_go": seed(factory, submitted_by="pipeline-a", sha=SHA_A, source="file:///models/a", verdict="GO",
                     artifact_uri="file:///models/a-q8_0.gguf"),
        "a_nogo": seed(factory, submitted_by="pipeline-a", sha=SHA_A, source="file:///models/a", verdict="NO-GO",
                       blockers=("tensor.value_mismatch",), artifact_uri="file:///models/a-q4_0.gguf"),
        "a_queued": seed(factory, submitted_by="pipeline-a", sha=SHA_A, source="file:///models/a", verdict=None),
        "b_hostile": seed(factory, submitted_by="pipeline-b", sha=SHA_B, source=HOSTILE, verdict="GO",
                          policy_origin="configured:strict"),
    }


@pytest.fixture
def client(database, tmp_path):
    app = create_app(settings_for(database, tmp_path), loops=no_loops)
    with TestClient(app, base_url="https://testserver") as test_client:
        test_client.ids = seeded(app.state.session_factory)
        test_client.database = database
        yield test_client


def sign_in(client, role: Role, target: str = "/ui/auditor") -> str:
    token = add_token(client.database, role)
    response = client.post("/ui/login", data={"token": token, "next": target}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == target, response.text
    return token


def result_ids(page: str) -> list[str]:
    return re.findall(r'<tr data-id="([0-9a-f-]{36})">', page)


def test_auditor_page_searches_escapes_and_links(client):
    sign_in(client, Role.AUDITOR)
    everything = client.get("/ui/auditor")
    assert everything.status_code == 200
    assert set(result_ids(everything.text)) == set(client.ids.values())
    assert "<script>window.pwned" not in everything.text and "onerror=\"window" not in everything.text
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in everything.text
    by_sha = client.get("/ui/auditor", params={"artifact_sha256": SHA_A, "source_uri": "", "verdict": "",
                                               "since": "", "until": "", "policy": ""})
    assert set(result_ids(by_sha.text)) == {client.ids[k] for k in ("a_go", "a_nogo", "a_queued")}
    nogo = client.get("/ui/auditor", params={"artifact_sha256": SHA_A, "verdict": "NO-GO"}).text
    assert result_ids(nogo) == [client.ids["a_nogo"]]
    assert f'href="/ui/verifications/{client.ids["a_nogo"]}/report"' in nogo
    assert f'href="/ui/verifications/{client.ids["a_nogo"]}/attestation"' in nogo
    query = urlencode({"artifact_sha256": SHA_A, "verdict": "NO-GO"})
    for fmt in ("csv", "jsonl"):
        assert f'href="{html.escape(f"/ui/export?{query}&format={fmt}")}"' in nogo
    assert result_ids(client.get("/ui/auditor", params={"policy": "strict"}).text) == [client.ids["b_hostile"]]
    assert result_ids(client.get("/ui/auditor", params={"source_uri": HOSTILE}).text) == [client.ids["b_hostile"]]
    assert result_ids(client.get("/ui/auditor", params={"since": "2999-01-01T00:00"}).text) == []
    assert len(result_ids(client.get("/ui/auditor", params={"until": "2999-01-01T00:00"}).text)) == 4
    queued_row = re.search(rf'<tr data-id="{client.ids["a_queued"]}">.*?</tr>', everything.text, re.S)[0]
    assert "/report" not in queued_row and "/attestation" not in queued_row


def test_auditor_page_says_what_is_wrong_with_a_search(client):
    sign_in(client, Role.AUDITOR)
    for params, message in (({"artifact_sha256": "xyz"}, "artifact sha256: 64 lowercase hex digits"),
                            ({"since": "yesterday"}, "since: a date and time"),
                            ({"verdict": "<b>MAYBE</b>"}, "verdict: GO or NO-GO")):
        page = client.get("/ui/auditor", params=params)
        assert page.status_code == 400 and message in page.text and result_ids(page.text) == []
        assert "<b>MAYBE" not in page.text


def test_report_attestation_and_export_through_the_page_cookie(client):
    sign_in(client, Role.AUDITOR)
    nogo = client.ids["a_nogo"]
    report = client.get(f"/ui/verifications/{nogo}/report")
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
    assert "tensor.value_mismatch" in report.text and "<b>tensor.value_mismatch</b>" not in report.text
    assert client.get(f"/ui/verifications/{client.ids['a_queued']}/report").status_code == 404
    attestation = client.get(f"/ui/verifications/{nogo}/attestation")
    assert attestation.status_code == 200
    assert attestation.headers["content-disposition"] == f'attachment; filename="{nogo}.intoto.jsonl"'
    verified = verify_envelope(attestation.json(), trusted_public_keys(client.app.state.settings))
    assert verified.statement.predicate.verification_id == nogo
    assert client.get(f"/ui/verifications/{client.ids['a_queued']}/attestation").status_code == 404
    exported = client.get("/ui/export", params={"artifact_sha256": SHA_A, "format": "jsonl"})
    assert exported.headers["content-disposition"] == 'attachment; filename="verdicts.jsonl"'
    assert [json.loads(line)["id"] for line in exported.text.splitlines()] == [client.ids["a_nogo"],
                                                                               client.ids["a_go"]]
    as_csv = client.get("/ui/export", params={"artifact_sha256": SHA_A, "format": "csv", "verdict": "GO"})
    assert as_csv.headers["content-type"].startswith("text/csv") and len(as_csv.text.splitlines()) == 2
    log = client.get("/v1/access-log", headers={"Authorization": f"Bearer {add_token(client.database, Role.AUDITOR)}"})
    actions = [entry["action"] for entry in log.json()["items"]]
    assert actions == ["export_verdicts", "export_verdicts", "read_attestation", "read_report"]  # newest first


def test_who_may_use_the_pages(client):
    nogo = client.ids["a_nogo"]
    paths = ("/ui/auditor", f"/ui/verifications/{nogo}/report", f"/ui/verifications/{nogo}/attestation",
             "/ui/export")
    for path in paths:  # not signed in: the sign-in form, which comes back here
        page = client.get(path)
        assert page.status_code == 401 and "name=\"next\"" in page.text, path
    for role in (Role.SUBMITTER, Role.POLICY_AUTHOR):
        refused = client.post("/ui/login", data={"token": add_token(client.database, role), "next": "/ui/auditor"},
                              follow_redirects=False)
        assert refused.status_code == 403 and "may not search verdicts" in refused.text
    foreign = client.post("/ui/login", data={"token": add_token(client.database, Role.OPERATOR),
                                             "next": "https://evil.example/"}, follow_redirects=False)
    assert foreign.headers["location"] == "/ui/queue"  # only the pages' own paths are followed
    assert client.post("/ui/login", data={"token": add_token(client.database, Role.AUDITOR)},
                       follow_redirects=False).status_code == 403  # the queue stays the operators'
    for role in (Role.AUDITOR, Role.OPERATOR, Role.ADMIN):
        sign_in(client, role)
        for path in paths:
            assert client.get(path).status_code == 200, (role, path)
    sign_in(client, Role.AUDITOR)
    with TestClient(client.app, base_url="https://testserver",
                    cookies={"convgate_token": client.cookies["convgate_token"]}) as other:
        assert other.get("/v1/verdicts/export").status_code == 401  # the cookie is for the pages only


def sign_in_with_the_form(browser: Browser, url: str, token: str) -> None:
    """Open `url` (the sign-in form, which returns there), type the token, submit, wait for the search form.
    (Browser.sign_in waits for the queue page's signs, and the auditor page has a form of its own.)"""
    browser.send("Page.navigate", url=url)
    browser.wait_for("document.querySelector('input[name=token]') !== null")
    browser.evaluate(f"document.querySelector('input[name=token]').value = {json.dumps(token)}; "
                     "document.querySelector('form').submit(); true")
    browser.wait_for("document.querySelector('form#search') !== null")


def test_auditor_searches_opens_a_report_and_downloads_in_chromium(database, tmp_path):
    for live in start_server(settings_for(database, tmp_path)):
        ids = seeded(live.app.state.session_factory)
        token = add_token(database, Role.AUDITOR)
        with Browser(tmp_path) as browser:
            sign_in_with_the_form(browser, f"{live.url}/ui/auditor", token)
            assert browser.url() == f"{live.url}/ui/auditor"
            rows = "[...document.querySelectorAll('table#results tbody tr')].map(tr => tr.dataset.id)"
            assert set(browser.evaluate(rows)) == set(ids.values())
            assert browser.evaluate("window.pwned === undefined && document.images.length === 0")
            browser.evaluate(f"document.querySelector('input[name=artifact_sha256]').value = '{SHA_A}'; "
                             "document.querySelector('form#search').submit(); true")
            browser.wait_for("location.search.includes('artifact_sha256')")
            assert set(browser.evaluate(rows)) == {ids[k] for k in ("a_go", "a_nogo", "a_queued")}
            browser.evaluate("document.querySelector('select[name=verdict]').value = 'NO-GO'; "
                             "document.querySelector('form#search').submit(); true")
            browser.wait_for("location.search.includes('NO-GO')")
            assert browser.evaluate(rows) == [ids["a_nogo"]]
            assert browser.evaluate("document.querySelector('input[name=artifact_sha256]').value") == SHA_A
            download = "(async href => { const r = await fetch(href); return [r.status, await r.text()]; })"
            status, envelope = browser.evaluate(
                f"{download}(document.querySelector('a.attestation').getAttribute('href'))")
            assert status == 200 and json.loads(envelope)["payloadType"] == PAYLOAD_TYPE
            status, lines = browser.evaluate(f"{download}(document.querySelector('a.export-jsonl').href)")
            assert status == 200 and [json.loads(line)["id"] for line in lines.splitlines()] == [ids["a_nogo"]]
            browser.evaluate("document.querySelector('a.report').click(); true")
            browser.wait_for(f"document.title === 'convgate {ids['a_nogo']}'")
            assert "tensor.value_mismatch" in browser.dom()
