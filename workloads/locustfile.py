"""locust user and load shape for the inference server (driven by loadgen.py).

Also usable with locust's own command line and web UI::

    GPUPROOF_RATES=10,50,100 GPUPROOF_STEP_S=10 locust -f locustfile.py --host http://127.0.0.1:8000

The shape steps through target request rates (requests/s), each for ``step_s`` seconds.
locust drives users, not rates, so each step runs ``ceil(rate / user_rps)`` users and
every user paces itself to ``users / rate`` seconds between request starts. A user
waits for its answer before the next request (closed loop): when latency exceeds the
pace the achieved rate falls below the target, which loadgen reports.

Every request's latency is timed here with ``time.perf_counter`` and kept exactly
(locust's own statistics round response times into buckets).
"""

from __future__ import annotations

import locust  # first: it monkey-patches the standard library for gevent

import json
import math
import os
import random
import time

from locust import FastHttpUser, LoadTestShape, task


class Plan:
    """What to run and what happened; one per process, shared by users and shape."""

    def __init__(self):
        self.rates = [float(r) for r in os.environ.get("GPUPROOF_RATES", "10").split(",") if r]
        self.step_s = float(os.environ.get("GPUPROOF_STEP_S", "10"))
        self.user_rps = float(os.environ.get("GPUPROOF_USER_RPS", "20"))
        self.max_users = int(os.environ.get("GPUPROOF_MAX_USERS", "1000"))
        self.unthrottled_users = int(os.environ.get("GPUPROOF_USERS", "32"))
        self.path = os.environ.get("GPUPROOF_PATH", "/infer")
        self.method = os.environ.get("GPUPROOF_METHOD", "POST")
        self.bodies: list[bytes] = [json.dumps({"inputs": [[0.1] * 256]}).encode()]
        self.t0: float | None = None
        self.inflight = 0  # requests sent and not answered yet
        # (start offset s, latency s, ok, step index, status code)
        self.records: list[tuple[float, float, bool, int, int]] = []

    def users_for(self, rate: float) -> int:
        """Users for one step; rate 0 means as fast as possible with a fixed user count."""
        if rate <= 0:
            return self.unthrottled_users
        return max(1, min(self.max_users, math.ceil(rate / self.user_rps)))

    def step_at(self, now: float) -> int:
        if self.t0 is None:
            self.t0 = now
        return int((now - self.t0) // self.step_s)

    def rate_at(self, step: int) -> float | None:
        return self.rates[step] if 0 <= step < len(self.rates) else None

    @property
    def duration_s(self) -> float:
        return self.step_s * len(self.rates)


PLAN = Plan()


class StepRateShape(LoadTestShape):
    """One step per target rate, ``PLAN.step_s`` seconds each, then stop."""

    def tick(self):
        rate = PLAN.rate_at(PLAN.step_at(time.perf_counter()))
        if rate is None:
            return None
        users = PLAN.users_for(rate)
        return users, float(max(users, min(100, users * 10)))  # a step's users within ~0.1-1 s


class InferenceUser(FastHttpUser):
    """Posts one inference request per task and records its exact latency."""

    def on_start(self):
        self._last_start = None

    def wait_time(self) -> float:
        now = time.perf_counter()
        rate = PLAN.rate_at(PLAN.step_at(now))
        if rate is None:  # past the last step: idle until loadgen stops the users
            return 0.1
        if rate == 0:  # unthrottled
            return 0.0
        running = max(1, self.environment.runner.user_count if self.environment.runner else 1)
        pace = running / rate
        if self._last_start is None:  # spread the first requests of the users over one pace
            return random.uniform(0, pace)
        return max(0.0, pace - (now - self._last_start))

    @task
    def infer(self):
        t0 = time.perf_counter()
        self._last_start = t0
        step = PLAN.step_at(t0)
        if PLAN.rate_at(step) is None:  # past the last step: nothing more to send
            return
        body = random.choice(PLAN.bodies) if PLAN.method == "POST" else None
        PLAN.inflight += 1
        try:
            resp = self.client.request(PLAN.method, PLAN.path, data=body,
                                       headers={"Content-Type": "application/json"})
        finally:
            PLAN.inflight -= 1
        latency = time.perf_counter() - t0
        code = resp.status_code or 0
        PLAN.records.append((t0 - PLAN.t0, latency, 200 <= code < 300, step, code))


__all__ = ["PLAN", "Plan", "StepRateShape", "InferenceUser", "locust"]
