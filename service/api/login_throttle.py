"""Sign-in attempts, throttled per client address and per token prefix.

`POST /ui/login` is the one route anyone may call without a token, and each call costs a database
lookup. A token bucket per address stops one client from flooding it; one per token prefix stops a
guesser spread over many addresses from hammering one token's neighbourhood. Behind a proxy every
client shares the proxy's address, so the per-address bucket then limits the proxy as a whole: the
burst is sized for people signing in, not for scripts (scripts use the bearer header, which is never
throttled here).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable


class LoginThrottle:
    """Token buckets kept in memory, oldest forgotten first. Used from the event loop only."""

    BURST = 10  # attempts a key may make at once
    REFILL_SECONDS = 6.0  # one attempt back per this long: ten a minute, sustained
    PREFIX_CHARS = 8

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_keys: int = 10_000) -> None:
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (attempts left, as of)

    def __len__(self) -> int:
        return len(self._buckets)

    def _left(self, key: str, now: float) -> float:
        left, as_of = self._buckets.get(key, (float(self.BURST), now))
        return min(float(self.BURST), left + (now - as_of) / self.REFILL_SECONDS)

    def wait_seconds(self, address: str, token: str) -> float:
        """0 and the attempt counted, or how long this caller must wait (nothing counted)."""
        now = self._clock()
        keys = (f"address:{address}", f"token:{token[:self.PREFIX_CHARS]}")
        left = {key: self._left(key, now) for key in keys}
        short = max(1.0 - value for value in left.values())
        if short > 0:
            return math.ceil(short * self.REFILL_SECONDS)
        for key in keys:
            self._buckets[key] = (left[key] - 1.0, now)
            self._buckets.move_to_end(key)
        while len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return 0.0
