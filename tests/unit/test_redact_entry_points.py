"""Every process entry point installs the log redaction before it can log a URL: `convgate serve` (which
runs the dispatch and callback loops in its lifespan), each loop on its own, and the worker. The check
is what a red team saw: an httpx "HTTP Request" line for a callback URL with `?sig=` and `user:pass@`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

import edge.redact
from service.config import Settings
from tests.unit.test_redact_uri import Collect

CALLBACK = "http://alice:PASSSECRET@127.0.0.1:9/hook?sig=SIGSECRET"


@pytest.fixture
def fresh_process(monkeypatch) -> Iterator[None]:
    """A process in which nothing has installed the redaction yet (an earlier test may have)."""
    previous = logging.getLogRecordFactory()
    logging.setLogRecordFactory(logging.LogRecord)
    monkeypatch.setattr(edge.redact, "_installed", False)
    yield
    logging.setLogRecordFactory(previous)




def httpx_line() -> str:
    """The line httpx logs for a request, as a handler formats it."""
    records: list[logging.LogRecord] = []
    handler = Collect(records)
    logger = logging.getLogger("httpx")
    logger.addHandler(handler)
    try:
        logger.warning('HTTP Request: %s %s "%s %d %s"', "POST", CALLBACK, "HTTP/1.1", 200, "OK")
    finally:
        logger.removeHandler(handler)
    return logging.Formatter("%(name)s %(message)s").format(records[0])


def assert_redacted(line: str) -> None:
    assert "SIGSECRET" not in line and "PASSSECRET" not in line, line
    assert "HTTP Request: POST http://REDACTED@127.0.0.1:9/hook?sig=REDACTED" in line


def test_without_an_entry_point_the_line_leaks(fresh_process):
    """The check can fail: before any entry point ran, httpx's line holds the secrets."""
    assert "SIGSECRET" in httpx_line()


def test_serve_installs_it_before_the_server_runs(fresh_process, monkeypatch, tmp_path):
    import uvicorn

    from service import cli

    lines: list[str] = []
    monkeypatch.setenv("CONVGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'convgate.db'}")
    # the server is replaced where serve() starts it: a real one would run until killed (an exception a
    # timeout raises inside uvicorn's event loop is caught and logged there, so the test would never end)
    monkeypatch.setattr(uvicorn.Server, "run", lambda *args, **kwargs: lines.append(httpx_line()))
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: pytest.fail("serve() no longer uses uvicorn.Server"))
    cli.serve(host="127.0.0.1", port=0, migrate=False)
    (line,) = lines
    assert_redacted(line)


def _callback_loop(settings: Settings) -> object:
    from service.callbacks_loop import CallbackLoop

    return CallbackLoop(None, settings)  # type: ignore[arg-type]  # built, never ticked


def _dispatch_loop(settings: Settings) -> object:
    from service.dispatch.loop import DispatchLoop

    return DispatchLoop(None, None, settings)  # type: ignore[arg-type]  # built, never ticked


@pytest.mark.parametrize("start", [_callback_loop, _dispatch_loop], ids=["callback-loop", "dispatch-loop"])
def test_each_background_loop_installs_it_when_built(fresh_process, tmp_path, start: Callable[[Settings], object]):
    start(Settings(database_url=f"sqlite:///{tmp_path / 'convgate.db'}", cache_dir=tmp_path / "cache"))
    assert_redacted(httpx_line())


def test_the_worker_installs_it_before_it_opens_its_channel(fresh_process, monkeypatch, tmp_path):
    """`convgate worker run` -> `run_verification`: redaction is on before the first line it can log."""
    from service import job

    lines: list[str] = []

    def channel_for(*args: object) -> object:
        lines.append(httpx_line())
        raise RuntimeError("stop here")

    monkeypatch.setattr(job, "channel_for", channel_for)
    with pytest.raises(RuntimeError, match="stop here"):
        job.run_verification(Settings(database_url=f"sqlite:///{tmp_path / 'c.db'}"), "v", "w", 1)
    assert_redacted(lines[0])


# --- what the installed record factory does to each record ----------------------------------------------

def _records(log: Callable[[logging.Logger], None]) -> list[logging.LogRecord]:
    records: list[logging.LogRecord] = []
    handler = Collect(records)
    logger = logging.getLogger("convgate.test-redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        log(logger)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    return records


def test_a_record_whose_arguments_do_not_fit_its_message_is_redacted_not_raised(fresh_process):
    edge.redact.install_log_redaction()
    (record,) = _records(lambda logger: logger.warning(f"POST {CALLBACK} %d", "not a number"))
    assert (record.msg, record.args) == ("POST http://REDACTED@127.0.0.1:9/hook?sig=REDACTED %d", None)


def test_an_exceptions_text_is_redacted(fresh_process):
    edge.redact.install_log_redaction()

    def log(logger: logging.Logger) -> None:
        try:
            raise ConnectionError(f"cannot reach {CALLBACK}")
        except ConnectionError:
            logger.exception("delivery failed")

    (record,) = _records(log)
    line = logging.Formatter().format(record)
    assert "SIGSECRET" not in line and "PASSSECRET" not in line, line
    assert record.exc_text is not None and record.exc_text.startswith("Traceback (most recent call last)")
    assert "ConnectionError: cannot reach http://REDACTED@127.0.0.1:9/hook?sig=REDACTED" in record.exc_text


def test_an_exception_handed_over_without_its_traceback_is_redacted(fresh_process):
    edge.redact.install_log_redaction()
    error = ConnectionError(f"cannot reach {CALLBACK}")
    (record,) = _records(lambda logger: logger.error("delivery failed", exc_info=(ConnectionError, error, None)))
    line = logging.Formatter().format(record)
    assert "SIGSECRET" not in line and line.endswith("ConnectionError: cannot reach "
                                                     "http://REDACTED@127.0.0.1:9/hook?sig=REDACTED"), line


def test_a_record_made_with_keywords_is_redacted(fresh_process):
    """logging.makeLogRecord and some libraries build records with keyword arguments."""
    edge.redact.install_log_redaction()
    record = logging.getLogRecordFactory()(name="x", level=logging.INFO, pathname=__file__, lineno=1,
                                           msg="POST %s", args=(CALLBACK,), exc_info=None)
    assert record.getMessage() == "POST http://REDACTED@127.0.0.1:9/hook?sig=REDACTED"


def test_it_is_installed_once(fresh_process):
    edge.redact.install_log_redaction()
    installed = logging.getLogRecordFactory()
    edge.redact.install_log_redaction()
    assert logging.getLogRecordFactory() is installed and edge.redact._installed is True
