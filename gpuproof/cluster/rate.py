"""A token bucket: at most ``rate`` takes a second on average, ``burst`` at once (issue #52).

The run's API client sends its requests through one (``--api-qps``: cluster/api.py), as client-go's clients do, and
the fan-out starts its pods through another (plugin/fanout.py): what protects an API server is the rate of requests,
not a small count of pods in flight. A waiter wakes when its stop event is set.
"""

from __future__ import annotations

import threading
import time


class TokenBucket:
    def __init__(self, rate: float, burst: float | None = None):
        if not rate > 0:
            raise ValueError(f"a rate must be more than 0 a second, got {rate!r}")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate)
        self._tokens = self.burst
        self._at = time.monotonic()
        self._lock = threading.Lock()
        self.taken = 0              # takes granted
        self.waited_s = 0.0         # seconds spent waiting for tokens, all takers together

    def _refill(self, now: float) -> None:
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self, n: float = 1.0, stop: threading.Event | None = None) -> bool:
        """Wait until ``n`` tokens are there (at most ``burst``), take them; False when ``stop`` was set first."""
        n = min(float(n), self.burst)
        t0 = None
        while True:
            with self._lock:
                now = time.monotonic()
                self._refill(now)
                if self._tokens >= n:
                    self._tokens -= n
                    self.taken += 1
                    if t0 is not None:
                        self.waited_s += now - t0
                    return True
                wait = (n - self._tokens) / self.rate
            if t0 is None:
                t0 = time.monotonic()
            if stop is not None:
                if stop.wait(min(wait, 1.0)):
                    return False
            else:
                time.sleep(min(wait, 1.0))
