"""Every HTML page and rendered report comes from a Jinja2 template under `service/templates`, with
autoescaping on for all of them: a value from a submitter, a worker or the cluster is escaped (quotes
too) unless someone writes `|safe`: escaping is the default, so nothing depends on remembering to call
an escape function around each value (one forgotten call would be an XSS). Nothing a submitter wrote
is ever marked safe; the one piece of markup passed through is a report's HTML, which markdown-it made
from Markdown in which every submitted string was already inert (service.report_render)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined

from service.persistence.clock import as_utc


def duration(seconds: float | None) -> str:
    """A wait or run time as people read it: 42s, 3m 07s, 2h 05m."""
    if seconds is None:
        return ""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole // 60 % 60:02d}m"


def artifact_name(uri: str | None) -> str:
    """The artifact's file name: the last segment of its URI's path (hf://org/repo@rev/x.gguf -> x.gguf)."""
    if not uri:
        return ""
    path = urlsplit(uri).path or uri
    return path.rstrip("/").rsplit("/", 1)[-1] or uri


def kueue(item: Any) -> str:
    """The Kueue status and, while Kueue reports one, the position: `pending admission #3`."""
    position = item.queue_position
    return " ".join(part for part in (item.cluster_status, None if position is None else f"#{position}") if part)


def utc_stamp(moment: datetime) -> str:
    return as_utc(moment).strftime("%Y-%m-%d %H:%M:%S")


ENVIRONMENT = Environment(loader=PackageLoader("service", "templates"),
                          autoescape=True,
                          undefined=StrictUndefined, auto_reload=False)
ENVIRONMENT.filters.update(duration=duration, artifact_name=artifact_name, kueue=kueue, utc_stamp=utc_stamp)


def render(name: str, **context: Any) -> str:
    return ENVIRONMENT.get_template(name).render(**context)
