"""Secrets in URIs (presigned query strings, `user:pass@`) never reach storage, reports or logs.

`redact` is the one function that hides them: it rewrites every URL it finds in a text, so it takes a
bare URI as well as an error message that quotes one. Query *values* are all replaced (a presigned
URL's signature, credential, token and expiry alike) while their names stay, so a reader still sees
what kind of URL it was; userinfo is replaced whole. `install_log_redaction` applies it to every log
record the process writes, including third-party loggers (httpx logs each request's full URL).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit, urlunsplit

HIDDEN = "REDACTED"
# a scheme, `://`, then everything up to whitespace or a quote; punctuation that ends a sentence or a
# "URL: reason" prefix is not part of it
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]*://[^\s'"<>`]*[^\s'"<>`:,.;)]""")


def _redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:  # an unparseable URL (bad IPv6 literal): hide everything after the scheme
        return url.split("://", 1)[0] + "://" + HIDDEN
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{HIDDEN}@{netloc.rsplit('@', 1)[1]}"
    query = "&".join(f"{pair.split('=', 1)[0]}={HIDDEN}" if "=" in pair else HIDDEN
                     for pair in parts.query.split("&")) if parts.query else ""
    fragment = HIDDEN if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact(text: str) -> str:
    """`text` with the secrets of every URL in it replaced by `REDACTED`."""
    return _URL.sub(lambda match: _redact_url(match.group(0)), text)


_installed = False


def install_log_redaction() -> None:
    """Redact every log record this process creates (message, arguments and traceback), once."""
    global _installed  # noqa: PLW0603 - one process-wide record factory, installed by the edges
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
