"""A background thread that calls `tick()` every `poll_seconds` until stopped: the shape of the
service's loops (dispatch, callbacks), which differ only in what one tick does and what stopping
releases."""

from __future__ import annotations

import logging
import threading


class Ticker:
    """Subclasses define `tick()` and may extend `close()`; a failed tick is logged and retried."""

    thread_name = "convgate-ticker"
    tick_name = "background"  # in the log line of a failed tick

    def __init__(self, poll_seconds: float, log: logging.Logger) -> None:
        self._poll_seconds = poll_seconds
        self._log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0  # ticks run so far, failed or not: a loop whose count stands still is stuck

    def tick(self) -> object:
        raise NotImplementedError

    def close(self) -> None:
        """What stopping releases after the thread has ended (clients, dispatchers)."""

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                self._log.exception("%s tick failed; retrying", self.tick_name)
            self.ticks += 1
            self._stop.wait(self._poll_seconds)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.close()
