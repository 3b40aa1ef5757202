"""Reports render only what we wrote (issue 22). Every string a submitter, a policy author, a worker or
the stored report controls is shown as text in the Markdown report, its HTML rendering, the model-card
section and the pages that show report or verification fields: never as a link, an image, a heading,
an extra table row or cell, emphasis, or a forged "Verdict" line; and a reader still sees it, escaped.

A hostile report is compared with a benign one of the same shape: the rendered documents must have the
same element structure (code spans aside: a plain token may be shown as code, hostile text is not)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from service.api.app import create_app, no_loops
from service.auth import Role
from service.persistence import repository
from service.persistence.db import transaction
from service.report_render import md_code, md_text, model_card, render_markdown, to_html, to_markdown
from tests.service.conftest import add_token, settings_for
from tests.service.seeding import seed

NASTY = ("[link](https://evil.example/l) ![img](https://evil.example/i.png) <https://evil.example/auto> "
         "<img src=x onerror=alert(1)><a href='https://evil.example'>a</a><h1>h</h1><script>x()</script> "
         "| cell | break |\n# Verdict: GO\nVerdict: GO\r\n===\n- item\n> quote\n1. one\n"
         "Thresholds: the configured policy `strict`.\n[download](https://evil.example/d.gguf)\n"
         "`tick` ``two`` *em* **strong** _u_ ~~s~~ &amp; &#60;b&#62; \\| \\ \t end")
SHOWN = str.maketrans({"\n": "\u240a", "\r": "\u240d", "\t": "\u2409"})
REPORT_FIELDS = ("verification id", "gate name", "gate status", "gguf type", "check kind", "compute class",
                 "threshold", "version", "tie ulps", "policy sha256", "artifact uri", "artifact sha256",
                 "file uri", "file sha256", "file size", "code", "gate", "tensor", "why", "not verified")
ORIGINS = pytest.mark.parametrize("origin", ["configured:", "inline", None], ids=["configured", "inline", "unknown"])


def hostile(field: str) -> str:
    return f"{field} {NASTY}"


INDENTED = "     " + hostile("indented")  # a list item opening with spaces is a code block, unless escaped


def benign(field: str) -> str:
    return field.replace(" ", "-")


def report_from(value) -> dict[str, Any]:
    """A NO-GO report, as the worker stores it, whose every string is `value(field)`."""
    return {
        "verdict": "NO-GO",
        "blockers": [{"code": value("code"), "gate": value("gate"), "tensor": value("tensor"), "why": value("why"),
                      "text": None}],
        "gates": {value("gate name"): {"status": value("gate status"), "seconds": 1.0, "details": {}},
                  "storage": {"status": "passed", "seconds": 2.0,
                              "details": {"check_kinds": {value("gguf type"): {value("check kind"): 3}}}},
                  "runtime": {"status": "passed", "seconds": 3.0,
                              "details": {"compute_classes": [value("compute class")],
                                          "thresholds": {value("threshold"): 0.5}}}},
        "policy": {"values": {"version": value("version"), "tie_ulps": value("tie ulps")},
                   "sha256": value("policy sha256")},
        "artifact": {"uri": value("artifact uri"), "sha256": value("artifact sha256"), "size": 1},
        "files": [{"uri": value("file uri"), "sha256": value("file sha256"), "size": value("file size")}],
        "not_verified": [value("not verified"), "     " + value("indented")], "environment": {}, "timings": {},
    }


class Parsed(HTMLParser):
    """An HTML document's element structure, its text blocks and everything a reader can see."""

    BLOCKS = frozenset({"p", "li", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "title"})

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.structure: list[str] = []
        self.starts: list[tuple[str, dict[str, str | None]]] = []
        self.blocks: list[tuple[str, str]] = []
        self.visible: list[str] = []
        self._open: list[tuple[str, list[str]]] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.starts.append((tag, dict(attrs)))
        self.visible += [value for _, value in attrs if value]
        if tag != "code":
            self.structure.append(tag)
        if tag in self.BLOCKS:
            self._open.append((tag, []))

    def handle_endtag(self, tag: str) -> None:
        if tag != "code":
            self.structure.append(f"/{tag}")
        if self._open and self._open[-1][0] == tag:
            name, parts = self._open.pop()
            self.blocks.append((name, "".join(parts).strip()))

    def handle_data(self, data: str) -> None:
        self.visible.append(data)
        for _, parts in self._open:
            parts.append(data)

    def text(self) -> str:
        return "\n".join(self.visible)


def unescaped(markdown: str) -> str:
    """What CommonMark shows for backslash-escaped punctuation."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


def origin_for(origin: str | None, value) -> str | None:
    return origin + value("policy name") if origin == "configured:" else origin


@ORIGINS
def test_markdown_report_keeps_hostile_text_on_its_line_and_shows_it(origin):
    bad = to_markdown(hostile("verification id"), report_from(hostile), origin_for(origin, hostile))
    good = to_markdown(benign("verification id"), report_from(benign), origin_for(origin, benign))
    assert bad.count("\n") == good.count("\n")  # no line break of the submitter's entered the document
    assert [line[:2] for line in bad.splitlines()] == [line[:2] for line in good.splitlines()]
    verdicts = [line for line in bad.splitlines() if line.startswith("Verdict")]
    assert len(verdicts) == 1 and verdicts[0].startswith(r"Verdict: **NO-GO** under convgate policy version \[link\]")
    for field in REPORT_FIELDS + (("policy name",) if origin == "configured:" else ()):
        assert hostile(field).translate(SHOWN) in unescaped(bad), field


@ORIGINS
def test_html_report_has_only_our_elements_and_shows_the_hostile_text(origin):
    bad = Parsed(to_html(hostile("verification id"), report_from(hostile), origin_for(origin, hostile)))
    good = Parsed(to_html(benign("verification id"), report_from(benign), origin_for(origin, benign)))
    assert bad.structure == good.structure
    assert not [tag for tag, _ in bad.starts if tag in ("a", "img", "script", "em", "blockquote", "hr", "pre")]
    headings = [text for tag, text in bad.blocks if re.fullmatch(r"h[1-6]", tag)]
    assert headings == [f"convgate verification {hostile('verification id').translate(SHOWN)}", "Blockers",
                        "Verification (model card section)"]
    verdicts = [text for _, text in bad.blocks if text.startswith("Verdict")]
    assert len(verdicts) == 1 and verdicts[0].startswith(f"Verdict: NO-GO under convgate policy version {NASTY[:6]}")
    assert len([text for _, text in bad.blocks if text.startswith("Thresholds")]) == (
        3 if origin == "configured:" else 1)  # where the thresholds came from (atop the report and the card)
    for field in REPORT_FIELDS + (("policy name",) if origin == "configured:" else ()):
        assert hostile(field).translate(SHOWN) in bad.text(), field
    assert INDENTED.translate(SHOWN) in bad.text()


def test_model_card_section_alone_renders_only_our_structure():
    bad = model_card(report_from(hostile), origin_for("configured:", hostile))
    good = model_card(report_from(benign), origin_for("configured:", benign))
    assert len(bad) == len(good) and not [line for line in bad if "\n" in line or "\r" in line]
    page = Parsed(render_markdown("\n".join(bad)))
    assert page.structure == Parsed(render_markdown("\n".join(good))).structure
    assert [text for _, text in page.blocks if text.startswith("Verdict")] == [
        text for _, text in page.blocks if text.startswith("Verdict: NO-GO under convgate policy version ")]
    assert len([row for row in page.starts if row[0] == "tr"]) == 2  # the head and the one file
    for field in ("version", "policy sha256", "file uri", "file sha256", "threshold", "not verified"):
        assert hostile(field).translate(SHOWN) in page.text(), field


# --- the pages: the auditor's search and report, the operator's queue ----------------------------------

PAGE_FIELDS = ("submitter", "source uri", "artifact uri", "worker", "failure reason", "cluster status", "stage")


def seed_hostile(factory) -> dict[str, str]:
    """A NO-GO verdict, a failed run and a running one, every string of each written by an adversary."""
    ids = {}
    with transaction(factory) as session:
        for name in ("verdict", "failed", "running"):
            request = {"source_uri": hostile("source uri"), "artifact_uri": hostile("artifact uri"),
                       "artifact_sha256": hostile("artifact sha256")}
            verification = seed(
                session, submitted_by=hostile("submitter"), idempotency_key=name, request_sha256="r" * 64,
                request=request, policy={"version": hostile("version")}, policy_sha256="p" * 64, max_attempts=1,
                policy_origin="configured:" + hostile("policy name")[:60])
            ids[name] = verification.id
            worker = hostile("worker")
            attempt = repository.claim(session, verification.id, worker).attempt
            assert repository.start_attempt(session, verification.id, worker, attempt=attempt) is not None
            if name == "verdict":
                assert repository.record_verdict(session, verification.id, attempt, report_from(hostile),
                                                 worker=worker)
            elif name == "failed":
                assert repository.fail_permanently(session, verification.id, attempt, hostile("failure reason"),
                                                   worker=worker)
            else:
                assert repository.heartbeat(session, verification.id, attempt,
                                            {"stage": hostile("stage"), "done": 1, "total": 2}, worker=worker)
                repository.record_cluster_status(session, repository.get_verification(session, verification.id),
                                                 hostile("cluster status"), 1)
    return ids


@pytest.fixture
def pages(sqlite_url, tmp_path):
    app = create_app(settings_for(sqlite_url, tmp_path), loops=no_loops)
    with TestClient(app, base_url="https://testserver") as client:
        client.ids = seed_hostile(app.state.session_factory)
        client.database = sqlite_url
        yield client


def sign_in(client, role: Role, target: str) -> None:
    response = client.post("/ui/login", data={"token": add_token(client.database, role), "next": target},
                           follow_redirects=False)
    assert response.status_code == 303, response.text


def assert_inert(page: str, headings: list[str], shown: tuple[str, ...], scripts: int = 0) -> Parsed:
    """Only our headings, links and scripts, no image or event handler; each hostile text visible."""
    parsed = Parsed(page)
    assert [text for tag, text in parsed.blocks if re.fullmatch(r"h[1-6]", tag)] == headings
    assert not [tag for tag, _ in parsed.starts if tag in ("img", "iframe", "svg", "object", "embed", "math")]
    assert len([tag for tag, _ in parsed.starts if tag == "script"]) == scripts
    assert not [name for _, attrs in parsed.starts for name in attrs if name.startswith("on")]
    assert all((attrs.get("href") or "").startswith("/ui/") for tag, attrs in parsed.starts if tag == "a")
    seen = parsed.text().replace("\r\n", "\n").replace("\r", "\n")
    for field in shown:
        assert hostile(field).replace("\r\n", "\n").replace("\r", "\n") in seen, field
    return parsed


def test_auditor_page_and_report_page_show_hostile_fields_as_text(pages):
    sign_in(pages, Role.AUDITOR, "/ui/auditor")
    search = pages.get("/ui/auditor")
    assert search.status_code == 200
    assert_inert(search.text, ["convgate — verdicts"], ("submitter", "source uri", "artifact uri", "artifact sha256"))
    refused = pages.get("/ui/auditor", params={"policy": hostile("policy"), "source_uri": hostile("source")})
    assert refused.status_code == 400
    assert_inert(refused.text, ["convgate — verdicts"], ("policy", "source"))
    report = pages.get(f"/ui/verifications/{pages.ids['verdict']}/report")
    assert report.status_code == 200
    parsed = assert_inert(report.text, ["convgate verification " + pages.ids["verdict"], "Blockers",
                                        "Verification (model card section)"], ())
    assert not [tag for tag, _ in parsed.starts if tag == "a"]
    assert [text for _, text in parsed.blocks if text.startswith("Verdict")] == [
        text for _, text in parsed.blocks if text.startswith("Verdict: NO-GO under convgate policy version ")]
    for field in REPORT_FIELDS[1:]:
        assert hostile(field).translate(SHOWN) in parsed.text(), field


def test_queue_page_and_its_table_show_hostile_fields_as_text(pages):
    sign_in(pages, Role.OPERATOR, "/ui/queue")
    queue = pages.get("/ui/queue")
    assert queue.status_code == 200
    assert_inert(queue.text, ["convgate — verification queue", "Recently finished"], (*PAGE_FIELDS, "code"),
                 scripts=1)  # the table's refresh
    table = pages.get("/ui/queue/table")
    assert table.status_code == 200
    parsed = assert_inert(table.text, ["Recently finished"], (*PAGE_FIELDS, "code"))
    assert len([tag for tag, _ in parsed.starts if tag == "tr"]) == 1 + 1 + 1 + 2  # two heads, 1 active, 2 done


def test_uris_and_versions_read_as_written_in_the_markdown_file():
    """Issue 35: every URI character was escaped (`file\\:\\/\\/\\/...`, `2026\\.12\\-1`), noise to a person
    reading the file or a diff. URIs are code spans; text escapes only what opens Markdown."""
    report = report_from(benign) | {"artifact": {"uri": "file:///srv/fixtures/m-Q8_0.gguf", "sha256": "a" * 64,
                                                 "size": 1}}
    report["files"] = [{"uri": "hf://org/model@" + "b" * 40 + "/model.safetensors", "sha256": "c" * 64, "size": 9}]
    report["policy"]["values"]["version"] = "2026.12-1"
    markdown = to_markdown("v-1", report, "inline")
    assert "Artifact: `file:///srv/fixtures/m-Q8_0.gguf`" in markdown
    assert f"| `hf://org/model@{'b' * 40}/model.safetensors` |" in markdown
    assert "under convgate policy 2026.12-1 (" in markdown
    assert md_code("a`b") == "``a`b``" and md_code("`x") == "`` `x ``" and md_code("a|b") == "a\\|b"
    assert md_text("# not a heading") == "\\# not a heading" and md_text("1. one") == "1\\. one"
    assert md_text("- item") == "\\- item" and md_text("a - b. c") == "a - b. c"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs", "Cc")), max_size=40))
def test_any_text_in_any_place_renders_as_itself_in_our_structure(value: str):
    """A property over the reduced escaping: in a list item, a table cell and mid-paragraph, md_text and
    md_code give the structure a plain word gives and show the text (line breaks as symbols)."""
    for render in (md_text, md_code):
        def document(text: str, render=render) -> str:
            return f"- {render(text)}\n\n| a | b |\n|---|---|\n| {render(text)} | x |\n\nSeen {render(text)} here.\n"

        bad, good = Parsed(render_markdown(document(value))), Parsed(render_markdown(document("word")))
        assert bad.structure == good.structure, (render.__name__, value)
        shown = value.translate(SHOWN).translate({code: 0x2400 + code for code in range(0x20)} | {0x7f: 0x2421})
        if shown.strip():
            assert all(shown.strip() in text for tag, text in bad.blocks if tag in ("li", "td", "p")
                       and text != "x"), (render.__name__, value, bad.blocks)
