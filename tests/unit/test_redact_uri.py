"""One parser hides the secrets of a URI, in a field (`redact_uri`) and in free text (`redact`): userinfo
with any characters, query and `;param` values, percent-encoded delimiters, hf:// paths. The table
pins the red team's findings (issue 22); the properties generate secret-bearing URIs of every form."""

from __future__ import annotations

import logging
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.redact import HIDDEN, install_log_redaction, redact, redact_uri

REV = "0123456789abcdef0123456789abcdef01234567"


# --- the red team's findings, one row each ---------------------------------------------------------

@pytest.mark.parametrize(("uri", "shown"), [
    pytest.param("https://user:SEC'RET@host/x", "https://REDACTED@host/x", id="quote-in-userinfo"),
    pytest.param("https://h.example/x;token=SECRET", "https://h.example/x;token=REDACTED", id="params"),
    pytest.param("https://h.example/a;v=1;sig=SECRET/b.gguf", "https://h.example/a;v=REDACTED;sig=REDACTED/b.gguf",
                 id="params-mid-path"),
    pytest.param("https://huggingface.co/o/r/resolve/main/f.gguf%3Ftoken%3DSECRET",
                 "https://huggingface.co/o/r/resolve/main/f.gguf%3Ftoken%3DREDACTED", id="encoded-query"),
    pytest.param("https://h.example/x%253Bsig%253DSECRET", "https://h.example/x%253Bsig%253DREDACTED",
                 id="double-encoded-params"),
    pytest.param("https://alice%3ASECRET%40h.example/x", "https://REDACTED%40h.example/x", id="encoded-userinfo"),
    pytest.param("https://alice:SE/CRET@h.example/x", "https://REDACTED", id="slash-in-password"),
    pytest.param("https://alice:SE?CR#ET@h.example/x", "https://REDACTED", id="query-chars-in-password"),
    pytest.param(f"hf://org/m@{REV}/dir/m.gguf?token=SECRET", f"hf://org/m@{REV}/dir/m.gguf?token=REDACTED",
                 id="hf-token"),
    pytest.param(f"hf://org/m@{REV}/m.gguf", f"hf://org/m@{REV}/m.gguf", id="hf-revision-is-no-userinfo"),
    pytest.param("https://h.example:8443/a/b.gguf", "https://h.example:8443/a/b.gguf", id="plain"),
    pytest.param("https://alice:SECRET@h.example/x", "https://REDACTED@h.example/x", id="userinfo"),
    pytest.param("https://h.example:SECRET/x", "https://REDACTED", id="implausible-port"),
])
def test_each_uri_form_is_redacted_in_a_field_and_in_text(uri, shown):
    assert redact_uri(uri) == shown
    assert redact(f"GET {uri}: HTTP 503 ('{uri}')") == f"GET {shown}: HTTP 503 ('{shown}')"


def test_a_field_query_value_with_spaces_is_hidden_whole():
    assert redact_uri("https://h.example/x?token=abc SECRET") == "https://h.example/x?token=REDACTED"
    assert redact_uri("https://h.example/x?a=1&token=abc SECRET#f g") == "https://h.example/x?a=REDACTED&token=REDACTED#REDACTED"


@pytest.mark.parametrize(("uri", "shown"), [
    pytest.param("https://h.example/x?a=1&&b=2", "https://h.example/x?a=REDACTED&&b=REDACTED", id="empty-pair"),
    pytest.param("https://h.example/x?", "https://h.example/x?", id="empty-query"),
    pytest.param("https://h.example/x#", "https://h.example/x#", id="empty-fragment"),
    pytest.param("https://h.example/x?a=1#", "https://h.example/x?a=REDACTED#", id="query-then-empty-fragment"),
    pytest.param("https://h.example?name=v", "https://h.example?name=REDACTED", id="path-less-query"),
    pytest.param("https://h.example:8443?name=v#f", "https://h.example:8443?name=REDACTED#REDACTED",
                 id="path-less-query-and-fragment"),
    pytest.param("https://h.example/a;p=1/b?name=v", "https://h.example/a;p=REDACTED/b?name=REDACTED",
                 id="params-then-query"),
    pytest.param("https://h.example/a;p=x?name=v", "https://h.example/a;p=REDACTED?REDACTED", id="query-in-params"),
    pytest.param("https://h.example/a;p=1;;q=2/b;r=3", "https://h.example/a;p=REDACTED;;q=REDACTED/b;r=REDACTED",
                 id="params-in-two-segments"),
    pytest.param("https://h.example/x?a=1;b=2;c", "https://h.example/x?a=REDACTED;b=REDACTED;REDACTED",
                 id="semicolons-in-query"),
    pytest.param("https://h.example/x?a=1&", "https://h.example/x?a=REDACTED&", id="trailing-ampersand"),
    pytest.param("https://h.example/a;?name=v", "https://h.example/a;?REDACTED", id="query-right-after-params"),
    pytest.param("https://user@/x", "https://REDACTED@/x", id="userinfo-right-before-the-path"),
    pytest.param("https://@h.example/x", "https://REDACTED@h.example/x", id="empty-userinfo"),
    pytest.param("https://h.example/p;tok=a@b/x", "https://REDACTED", id="at-in-a-path-or-a-slash-in-a-password"),
    pytest.param("https://h.example:443/a@b", "https://REDACTED", id="at-after-the-first-slash"),
    pytest.param("models/m.gguf;tok=abc", "models/m.gguf;tok=REDACTED", id="no-scheme"),
    pytest.param("x.gguf", "x.gguf", id="a-bare-name"),
    pytest.param("https://h.example#frag", "https://h.example#REDACTED", id="path-less-fragment"),
    pytest.param("https://h.example;tok=abc", "https://h.example;tok=REDACTED", id="path-less-params"),
    pytest.param("mailto:alice@h.example?subject=x", "mailto:REDACTED@h.example?subject=REDACTED", id="no-authority"),
])
def test_names_and_empty_parts_stay_as_written(uri, shown):
    """Over-redaction leaks nothing, so the properties cannot see it: these pin what a reader still sees."""
    assert redact_uri(uri) == shown


@pytest.mark.parametrize(("text", "shown"), [
    pytest.param("at https://[::1]]", "at https://[::1]]", id="ipv6-bracket-then-stray"),
    pytest.param("(https://h.example/x?a=1])", "(https://h.example/x?a=REDACTED])", id="closing-bracket-after-query"),
    pytest.param("see [https://[::1]:8443/x?a=1]", "see [https://[::1]:8443/x?a=REDACTED]", id="bracketed-url"),
    pytest.param("https://h.example/x?a=1]]", "https://h.example/x?a=REDACTED]]", id="two-brackets"),
])
def test_a_url_in_prose_ends_before_its_closing_punctuation(text, shown):
    assert redact(text) == shown


def test_text_without_a_url_is_left_alone():
    assert redact("no URL here, just text?sig=x; user@host") == "no URL here, just text?sig=x; user@host"


# --- properties --------------------------------------------------------------------------------------

# a secret is recognisable in any output: "SEC" never appears in a redacted URI's kept parts
secrets = st.text(string.ascii_letters + string.digits, min_size=4, max_size=12).map(lambda s: f"SEC{s}")
hosts = st.sampled_from(["h.example", "8.8.8.8", "[2001:db8::1]", "h.example:8443", "xn--bcher-kva.example"])
schemes = st.sampled_from(["https", "http", "s3", "gs"])
segments = st.text(string.ascii_lowercase + string.digits + "-_.", min_size=1, max_size=8)
paths = st.lists(segments, max_size=3).map(lambda parts: "".join(f"/{p}" for p in parts))
names = st.sampled_from(["token", "sig", "X-Amz-Signature", "X-Goog-Credential", "expires"])
# any character but whitespace and `/` (what ends a path segment or a URL in prose); quotes, `@`,
# `%`, `#`, `?`, `;`, `=` and non-ASCII included
text_chars = st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc", "Cs"), blacklist_characters="/")


def _surround(secret: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(st.text(text_chars, max_size=4), secret, st.text(text_chars, max_size=4)).map("".join)


def _encode(delimiter: str, depth: int) -> str:
    return delimiter if depth == 0 else "%" + "25" * (depth - 1) + f"{ord(delimiter):02X}"


@st.composite
def secret_uris(draw: st.DrawFn, *, spaces: bool = False, hosts: st.SearchStrategy[str] = hosts,
                schemes: st.SearchStrategy[str] = schemes) -> tuple[str, str]:
    """(uri, secret): one URI hiding one secret in one of the forms the parser must know."""
    secret = draw(secrets)
    if spaces:  # a stored field: a value may hold spaces
        secret = draw(st.sampled_from([f"abc {secret}", f"{secret} x", f"a b {secret}"]))
    hidden = draw(_surround(st.just(secret)))
    depth = draw(st.integers(0, 2))
    query, equals, semicolon = _encode("?", depth), _encode("=", depth), _encode(";", depth)
    form = draw(st.sampled_from(["userinfo", "query", "params", "hf"]))
    scheme, host, path, name = draw(schemes), draw(hosts), draw(paths), draw(names)
    if form == "userinfo":
        user = draw(st.sampled_from(["alice", "", "a'b"]))
        at = _encode("@", draw(st.integers(0, 1)))
        return f"{scheme}://{user}:{hidden}{at}{host}{path}", secret
    if form == "query":
        before = draw(st.sampled_from(["", "a=1&", "plain&"]))
        return f"{scheme}://{host}{path}/f.gguf{query}{before}{name}{equals}{hidden}", secret
    if form == "params":
        value = hidden.replace("?", "").replace("#", "")  # `?` or `#` would start a query: hidden all the same
        after = draw(st.sampled_from(["", "/m.gguf"]))
        return f"{scheme}://{host}{path}/x{semicolon}{name}{equals}{value}{after}", secret
    return f"hf://org/model@{REV}{path}/m.gguf{query}{name}{equals}{hidden}", secret


@given(secret_uris(spaces=True))
def test_a_field_never_shows_its_secret(case):
    uri, secret = case
    assert secret not in redact_uri(uri)
    assert secret not in redact(redact_uri(uri))


@given(secret_uris(), st.sampled_from(["GET {}: HTTP 503", "'{}'", "({})", "<{}>.", "refused: {} (policy)"]))
def test_a_url_in_text_never_shows_its_secret(case, template):
    uri, secret = case
    assert secret not in redact(template.format(uri))
    assert secret not in redact_uri(uri)


@given(secret_uris(spaces=True))
def test_redaction_is_idempotent(case):
    once = redact_uri(case[0])
    assert redact_uri(once) == once and redact(once) == once


@given(schemes, hosts, paths)
def test_a_uri_without_secrets_is_kept_as_written(scheme, host, path):
    for uri in (f"{scheme}://{host}{path}/m.gguf", f"hf://org/model@{REV}{path}/m.gguf", f"file://{path}/m@v2.gguf"):
        assert redact_uri(uri) == uri and redact(f"fetching {uri}: done") == f"fetching {uri}: done"



class Collect(logging.Handler):
    """Keeps each record it is handed."""

    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

@given(secret_uris())
def test_a_log_record_never_shows_the_secret(case):
    """What httpx writes for each request: the URL as a %-argument, formatted after the record exists."""
    uri, secret = case
    install_log_redaction()
    records: list[logging.LogRecord] = []
    handler = Collect(records)
    logger = logging.getLogger("httpx")
    logger.addHandler(handler)
    try:
        logger.warning('HTTP Request: %s %s "%s"', "POST", uri, "HTTP/1.1 200 OK")
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert secret not in logging.Formatter().format(record) and HIDDEN in record.getMessage()
