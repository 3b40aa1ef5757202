"""Secrets in URIs (presigned query strings, `user:pass@`, `;params`) never reach storage, reports or logs.

One parser decides what is secret; two entry points apply it:

- `redact_uri(value)` for a string that *is* one URI (a stored or returned field): everything after
  the first `?` is query, even a value with spaces in it.
- `redact(text)` for free text (log lines, error reasons): every URL candidate in it (a scheme and
  `://` up to whitespace) goes through the same parser.

Query and `;param` *values* are all replaced (a presigned URL's signature, credential, token and expiry
alike) while plain names stay, so a reader still sees what kind of URL it was; userinfo and fragments
are replaced whole. Delimiters count percent-encoded too (`%3F`, `%3B`, `%40`, `%3D`, `%26`, `%23`, at
any depth of `%25`), because a client that decodes once would otherwise send the hidden query; but an
`&` or `;` encoded deeper than the delimiter that began its query or params is a value's character, never
a separator that would show what follows as a name. In `hf://owner/repo@rev/path` the `@` is a revision,
not userinfo, and stays readable. When the authority is not a plausible host (a password holding `/`, a
broken IPv6 literal) or could end in two places (an `@` after a `?` or `#` and before any `/`: a password
holding `?`, or a path-less URI with an `@` in its query), everything after the scheme is hidden:
over-redacting is acceptable, leaking is not. `install_log_redaction` applies `redact` to
every log record the process writes, including third-party loggers (httpx logs each request's URL).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

HIDDEN = "REDACTED"

# a delimiter, literal or percent-encoded (`%253F` is `%3F` encoded once more)
_DELIMITER = re.compile(r"%(?:25)*(?P<code>3F|23|3B|40|3D|26)|(?P<char>[?#;@=&/])", re.IGNORECASE)
_DECODED = {"3F": "?", "23": "#", "3B": ";", "40": "@", "3D": "=", "26": "&"}
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# a host (a registered name, an IPv4 address or a bracketed IPv6 literal) and an optional numeric port
_HOST_PORT = re.compile(r"(?:[\w.~-]*|\[[0-9A-Fa-f:.]+(?:%\w+)?\])(?::\d*)?")
# a query or parameter name shown as is; anything else could be a secret written where a name goes
_NAME = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}")
# free text: a URL starts at a scheme and `://` (or its percent-encoding) and runs to whitespace (a URL
# quoted inside it is then part of its path or query, hidden with it); the lookbehind keeps the scan
# linear on long words
_CANDIDATE = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*(?:://|%(?:25)*3A%(?:25)*2F%(?:25)*2F)\S*",
                        re.IGNORECASE)
# schemes whose `@` after the authority is part of a path (hf:// revisions, local file names)
_PATH_AT_SCHEMES = frozenset({"hf", "file"})
_TRAILING = "'\"<>`),.;:!]}"  # sentence punctuation and quotes after a URL in prose


@dataclass(frozen=True)
class _Token:
    """A run of text, or one delimiter (`delimiter` is its decoded character, `text` as written, `depth`
    how many times it was percent-encoded: 0 for a literal one)."""

    text: str
    delimiter: str = ""
    depth: int = 0


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    position = 0
    for match in _DELIMITER.finditer(text):
        if match.start() > position:
            tokens.append(_Token(text[position:match.start()]))
        code = match.group("code")
        if code:
            tokens.append(_Token(match.group(0), _DECODED[code.upper()], (len(match.group(0)) - 1) // 2))
        else:
            tokens.append(_Token(match.group(0), match.group("char")))
        position = match.end()
    if position < len(text):
        tokens.append(_Token(text[position:]))
    return tokens


def _find(tokens: list[_Token], *delimiters: str, start: int = 0) -> int:
    """Index of the first token at or after `start` that is one of `delimiters`; len(tokens) if none."""
    return next((i for i in range(start, len(tokens)) if tokens[i].delimiter in delimiters), len(tokens))


def _last(tokens: list[_Token], delimiter: str, end: int) -> int:
    """Index of the last `delimiter` token before `end`; -1 if none."""
    return next((i for i in range(end - 1, -1, -1) if tokens[i].delimiter == delimiter), -1)


def _text(tokens: list[_Token]) -> str:
    return "".join(token.text for token in tokens)


def _pairs(tokens: list[_Token], depth: int) -> str:
    """A query or a run of `;params` begun by a delimiter encoded `depth` times: each value hidden, each
    name kept when it looks like a name. Only an `&` or `;` encoded no deeper than that first delimiter
    separates pairs: one encoded deeper is a character of a value (`?a=x%26b%3Dc` is one value, `x&b=c`),
    and treating it as a separator would show what follows it as a name."""
    out: list[str] = []
    piece: list[_Token] = []
    for token in [*tokens, _Token("", "&")]:
        if token.delimiter in ("&", ";") and token.depth <= depth:
            out.append(_pair(piece) + token.text)
            piece = []
        else:
            piece.append(token)
    return "".join(out)


def _pair(piece: list[_Token]) -> str:
    if not piece:
        return ""
    equals = _find(piece, "=")
    name = _text(piece[:equals])
    if equals == len(piece) or not _NAME.fullmatch(name):
        return HIDDEN
    return f"{name}{piece[equals].text}{HIDDEN}"


def _path(tokens: list[_Token]) -> str:
    """The path as written, each segment's `;params` hidden."""
    out, position = [], 0
    while (semicolon := _find(tokens, ";", start=position)) < len(tokens):
        end = _find(tokens, "/", start=semicolon)
        out.append(_text(tokens[position:semicolon]) + tokens[semicolon].text
                   + _pairs(tokens[semicolon + 1:end], tokens[semicolon].depth))
        position = end
    return "".join(out) + _text(tokens[position:])


def _userinfo_end(tokens: list[_Token]) -> int:
    """Index of the `@` that ends the userinfo, -1 if none: the last `@` before the first `/` (so a
    password may hold `'`; one holding `?` or `#` is ambiguous, see `_ambiguous`)."""
    return _last(tokens, "@", _find(tokens, "/"))


def _ambiguous(tokens: list[_Token], scheme: str) -> bool:
    """Two readings of where the authority ends, so the caller hides everything. An `@` before the first
    `/` but after a `?` or `#`: a password holding `?` or `#`, or a path-less URI whose query or fragment
    holds an `@` (`https://h:8443?sig=abc@SECRET`, where the userinfo reading shows `SECRET` as the host).
    An `@` after the first `/` and before any query: a password holding `/`, or a path holding an `@`
    (`;tok=a@b`). In hf:// that `@` is the revision and in file:// part of a local path: both are paths,
    shown."""
    if scheme.lower() in _PATH_AT_SCHEMES:
        return False
    query, slash = _find(tokens, "?", "#"), _find(tokens, "/")
    return _last(tokens, "@", query) > slash or query < _userinfo_end(tokens)


def _in_params(tokens: list[_Token], query: int) -> bool:
    """Whether the `?` at `query` sits inside a segment's `;params`: an encoded one is then a character of
    a param value, and what follows it up to the fragment is that value's (no name in it may be shown)."""
    return _last(tokens, ";", query) > _last(tokens, "/", query)


def _after_authority(tokens: list[_Token]) -> str:
    """Path, `;params`, query and fragment of what follows the authority (or of a scheme-less text)."""
    query = _find(tokens, "?", "#")
    out = _path(tokens[:query])
    fragment = _find(tokens, "#")  # the first `#` is the query's delimiter or after it
    if query < fragment:
        hidden = HIDDEN if _in_params(tokens, query) else _pairs(tokens[query + 1:fragment], tokens[query].depth)
        out += tokens[query].text + hidden
    if fragment < len(tokens):
        out += tokens[fragment].text + (HIDDEN if fragment + 1 < len(tokens) else "")
    return out


def redact_uri(value: str) -> str:
    """`value`, one whole URI, with its userinfo, query values, `;param` values and fragment hidden."""
    scheme_match = _SCHEME.match(value)
    head = scheme_match.group(0) if scheme_match else ""
    scheme, rest = head[:-1], value[len(head):]
    hierarchical = rest.startswith("//")
    if hierarchical:
        head, rest = head + "//", rest[2:]
    tokens = _tokens(rest)
    if _ambiguous(tokens, scheme):
        return head + HIDDEN
    at = _userinfo_end(tokens)
    userinfo = HIDDEN + tokens[at].text if at >= 0 else ""
    tokens = tokens[at + 1:]
    if not hierarchical:  # no authority (mailto:, file:relative, a bare path): the rest is a path
        return head + userinfo + _after_authority(tokens)
    host_end = _find(tokens, "/", "?", "#", ";")
    if not _HOST_PORT.fullmatch(_text(tokens[:host_end])) or any(t.delimiter for t in tokens[:host_end]):
        return head + HIDDEN
    return head + userinfo + _text(tokens[:host_end]) + _after_authority(tokens[host_end:])


def _url_end(candidate: str) -> int:
    """Where the URL in a whitespace-delimited candidate ends: before the punctuation and quotes after it,
    a `]` kept when it closes an IPv6 literal."""
    end = len(candidate)
    while end and candidate[end - 1] in _TRAILING:
        url = candidate[:end]
        if url[-1] == "]" and url.count("[") >= url.count("]"):
            break
        end -= 1
    return end


def _redact_candidate(match: re.Match[str]) -> str:
    candidate = match.group(0)
    end = _url_end(candidate)
    return redact_uri(candidate[:end]) + candidate[end:]


def redact(text: str) -> str:
    """`text` with the secrets of every URL in it hidden (the same parser as `redact_uri`, applied to
    each scheme-and-`://` run up to whitespace; a query value after a space in prose cannot be told
    from the prose, so a field that is one URI goes through `redact_uri` instead)."""
    return _CANDIDATE.sub(_redact_candidate, text)


_installed = False


def install_log_redaction() -> None:
    """Redact every log record this process creates (message, arguments and traceback), once.
    Every entry point (`serve`, the dispatch and callback loops, the worker) calls it at start-up."""
    global _installed  # noqa: PLW0603 - one process-wide record factory, installed by the entry points
    if _installed:
        return
    previous = logging.getLogRecordFactory()
    formatter = logging.Formatter()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            record.msg, record.args = redact(record.getMessage()), None
        except (TypeError, ValueError):  # a malformed call: hide its raw arguments rather than fail the caller
            record.msg, record.args = redact(str(record.msg)), None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact(formatter.formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(factory)
    _installed = True
