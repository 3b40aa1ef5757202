"""Asking the kernel for the bytes the streamed reference reads next, while it computes with the ones it has.

Why: a streamed reference reads each module's weights just before the module runs. On a pod whose page
cache cannot hold the model (a 7B source and its F16 are 27 GB together), every read waits for the disk
while the CPU idles, and the disk idles while the module computes. Naming the next modules' byte ranges
to the kernel (`posix_fadvise(WILLNEED)`, which starts an asynchronous read into the page cache) lets the
two overlap. The advice is given from one background thread, because the call itself can wait on a busy
disk queue. It is a hint only: nothing reads through it, nothing waits for it, and a failure is ignored
(the module's own read then waits as it did before).
"""

from __future__ import annotations

import os
import queue
import threading

_Range = tuple[str, int, int]  # (file, offset, length)


class ReadAhead:
    """One daemon thread advising the kernel of byte ranges, in the order they were asked for."""

    def __init__(self) -> None:
        self._asked: queue.SimpleQueue[_Range] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def ask(self, path: str, offset: int, length: int) -> None:
        """Start reading `length` bytes of `path` at `offset` into the page cache; returns at once."""
        if length <= 0 or not hasattr(os, "posix_fadvise"):
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._advise, name="convgate-read-ahead", daemon=True)
                self._thread.start()
        self._asked.put((path, offset, length))

    def _advise(self) -> None:
        while True:
            path, offset, length = self._asked.get()
            try:
                descriptor = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(descriptor, offset, length, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(descriptor)


READ_AHEAD = ReadAhead()  # one thread per process, whichever checkpoints ask
