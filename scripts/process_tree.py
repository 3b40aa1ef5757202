"""Peaks of a process tree's memory and its storage reads, sampled from /proc while it runs.

Why a sampler and not `ru_maxrss`: a verification is a tree (the engine, gate 1's pool, the llama.cpp
child), and a pod's limit applies to the sum; `ru_maxrss` gives one process's peak. RssAnon is what a
pod's memory limit cannot reclaim; VmRSS also counts mapped model pages the kernel can drop and re-read.
"""

from __future__ import annotations

import threading
import time

import psutil

PERIOD_S = 0.05


class Sampler:
    """Peaks of a process tree's VmRSS and RssAnon (KiB), and its storage reads over time, every 50 ms."""

    def __init__(self, root: int) -> None:
        self.root = psutil.Process(root)
        self.rss = self.anon = 0
        self.read: dict[int, int] = {}  # pid -> its last read_bytes
        self.timeline: list[tuple[float, int]] = []
        self.done = threading.Event()
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(PERIOD_S):
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                continue
            rss = anon = 0
            for process in tree:
                try:
                    with open(f"/proc/{process.pid}/status") as status:
                        fields = dict(line.split(":", 1) for line in status if line.startswith(("VmRSS", "RssAnon")))
                    self.read[process.pid] = process.io_counters().read_bytes
                except (OSError, psutil.Error):
                    continue
                rss += int(fields.get("VmRSS", "0 kB").split()[0])
                anon += int(fields.get("RssAnon", "0 kB").split()[0])
            self.rss, self.anon = max(self.rss, rss), max(self.anon, anon)
            self.timeline.append((time.perf_counter() - self.started, sum(self.read.values())))

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def read_by(self, seconds: float) -> int:
        """Bytes read by the tree in its first `seconds`."""
        return max((read for at, read in self.timeline if at <= seconds), default=0)
