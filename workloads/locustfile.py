"""locust user for OpenAI-compatible completion servers (driven by loadgen.py).

Open-loop arrivals on a schedule: a step offers ``rate`` requests/s for ``step_s``
seconds as ``round(rate * step_s)`` tickets due at ``t0 + i / rate``. A pool of
users takes the tickets in order; a user that takes a ticket early sleeps until it is
due, sends the request and reads the streamed answer. A user with no ticket waits on an
event that ``begin_step`` sets: idle users cost nothing (no polling), whatever their number.
Each send's lateness against its
due time (schedule lag) is kept: a send is late when every user was still busy (too few
users, or a user pausing ``think_s`` after each answer) or the client's event loop was
too busy to wake up in time. loadgen reports the offered, sent and served rates.
In locust's distributed mode each of N worker processes takes every N-th ticket of the
same schedule (``Plan.begin_step(share=...)``), so together they offer the step's rate.

Per request, timed here with ``time.perf_counter``: time to first token (TTFT), the
gaps between streamed chunks (inter-token latency), end-to-end latency and the output
token count (``usage.completion_tokens`` when the server sends it, else the chunks
with text); time per output token TPOT = (e2e - TTFT) / (tokens - 1).
"""

from __future__ import annotations

import locust  # first: it monkey-patches the standard library for gevent

import json
import os
import random
import re
import time

import gevent
from gevent.event import Event
from locust import FastHttpUser, task

WORDS = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
         "word but not what all were we when your can said there use an each which she do how their if will up "
         "other about out many then them these so some her would make like him into time has look two more write "
         "go see number no way could people my than first water been call who oil its now find long down day did "
         "get come made may part").split()


def make_prompts(n: int, words: int, seed: int) -> list[str]:
    """``n`` distinct prompts of exactly ``words`` common English words (about one token each)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(n)]



def _token_arrived(rec: dict, t0: float, last: float | None, now: float) -> float:
    """Record a streamed token's time: TTFT for the first, the gap since the last one after. Returns now."""
    if last is None:
        rec["ttft_s"] = now - t0
    else:
        rec["itl_s"].append(now - last)
    return now

class Plan:
    """What to send and what happened; one per process, shared by the users and loadgen."""

    def __init__(self):
        self.path = "/v1/completions"
        self.model = os.environ.get("GPUPROOF_MODEL", "")
        self.max_tokens = int(os.environ.get("GPUPROOF_MAX_TOKENS", "32"))
        self.ignore_eos = True
        self.think_s = 0.0
        self.timeout_s = 600.0
        self.prompts = make_prompts(64, int(os.environ.get("GPUPROOF_INPUT_TOKENS", "64")), 0)
        self.step = -1
        self.due: list[float] = []          # due times of the current step's tickets
        self.tickets: list[int] = []        # their indexes in the step's whole schedule
        self.next_ticket = 0
        self.ticket_ready = Event()         # set while the step has tickets nobody took
        self.step_done = Event()            # set once every ticket of the step has its answer
        self.inflight = 0
        # one dict per request (see InferenceUser.complete)
        self.records: list[dict] = []
        self.done: dict[int, int] = {}      # step -> requests finished (answered or failed)
        self._n = 0

    def begin_step(self, step: int, rate: float, step_s: float, lead_s: float = 0.05,
                   share: tuple[int, int] = (0, 1)) -> float:
        """Schedule the step's tickets; returns its start time (perf_counter).

        ``share=(i, n)``: this process is worker ``i`` of ``n`` and sends tickets i, i+n, i+2n, ...
        of the step's schedule, so ``n`` workers together offer ``rate`` on one schedule."""
        t0 = time.perf_counter() + lead_s
        total = max(1, round(rate * step_s))
        first, every = share
        self.tickets = list(range(first, total, every))
        self.step, self.due, self.next_ticket = step, [t0 + i / rate for i in self.tickets], 0
        self.step_done.clear()
        if self.tickets:
            self.ticket_ready.set()
        else:       # this worker's share of a short step is empty
            self.step_done.set()
        return t0

    def configure(self, cfg: dict) -> None:
        """What to send, as the master tells a worker (loadgen.py, distributed mode)."""
        self.model, self.max_tokens = cfg["model"], cfg["max_tokens"]
        self.ignore_eos, self.think_s = cfg["ignore_eos"], cfg["think_s"]
        self.prompts = make_prompts(cfg["n_prompts"], cfg["input_tokens"], cfg["seed"])

    def end_step(self) -> None:
        self.due, self.tickets, self.next_ticket = [], [], 0
        self.ticket_ready.clear()

    def finished(self, step: int) -> None:
        """One request of ``step`` ended (answered or failed); wakes loadgen when it was the step's last."""
        self.done[step] = self.done.get(step, 0) + 1
        if step == self.step and self.next_ticket >= len(self.due) and self.done[step] >= len(self.due):
            self.step_done.set()

    def take(self):
        """The next ticket (step, index, due, taken-at) or None when the step has none left."""
        if self.next_ticket >= len(self.due):
            self.ticket_ready.clear()
            return None
        i = self.next_ticket
        self.next_ticket += 1
        return self.step, self.tickets[i], self.due[i], time.perf_counter()

    def body(self) -> bytes:
        self._n += 1
        b = {"prompt": self.prompts[self._n % len(self.prompts)], "max_tokens": self.max_tokens,
             "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.0}
        if self.model:
            b["model"] = self.model
        if self.ignore_eos:
            b["ignore_eos"] = True
            b["min_tokens"] = self.max_tokens
        return json.dumps(b).encode()


PLAN = Plan()
# events that carry more than a token: decoded in full. Any other event's first "text" value is
# the token (OpenAI completions put choices[0].text first); an escaped \"text\" inside a string
# cannot match, since a backslash stands between its quotes.
_NEEDS_PARSE = re.compile(rb'"(?:usage|error|gpuproof)"\s*:')
_TEXT = re.compile(rb'"text"\s*:\s*"(.)', re.S)


class _WholeBody:
    def __init__(self, resp):
        self.lines = (resp.content or b"").splitlines(keepends=True)

    def readline(self, sep=b"\n"):
        return self.lines.pop(0) if self.lines else b""


class InferenceUser(FastHttpUser):
    """Takes tickets from the plan, sends one streamed completion per ticket."""

    network_timeout = 600.0
    connection_timeout = 30.0

    def wait_time(self) -> float:
        return 0.0

    @task
    def complete(self):
        ticket = PLAN.take()
        if ticket is None:
            PLAN.ticket_ready.wait()  # asleep until loadgen schedules the next step
            return
        step, index, due, taken = ticket
        delay = due - time.perf_counter()
        if delay > 0:
            gevent.sleep(delay)
        body = PLAN.body()
        t0 = time.perf_counter()
        rec = {"step": step, "i": index, "lag_s": t0 - due, "starved": taken > due + 0.001, "sent": t0,
               "ok": False, "code": 0, "ttft_s": None, "e2e_s": None, "tokens": 0, "itl_s": [], "error": None}
        PLAN.inflight += 1
        try:
            self._send(body, rec, t0)
        except Exception as exc:  # connection errors, malformed streams: a failed request, not a crash
            rec["error"] = rec["error"] or f"{type(exc).__name__}: {exc}"
        finally:
            if rec["e2e_s"] is None:    # failed: when it ended, so that it leaves the in-flight count
                rec["e2e_s"] = time.perf_counter() - t0
            PLAN.inflight -= 1
            PLAN.records.append(rec)
            PLAN.finished(step)
        if PLAN.think_s > 0:
            gevent.sleep(PLAN.think_s)

    def _send(self, body: bytes, rec: dict, t0: float) -> None:
        resp = self.client.request("POST", PLAN.path, data=body, stream=True,
                                   headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        rec["code"] = code = resp.status_code or 0
        if not 200 <= code < 300:
            rec["error"] = f"HTTP {code}"
            try:
                _ = resp.content  # read and drop the error body so the connection can be reused
            except Exception:
                pass
            return
        # geventhttpclient's response: readline returns as soon as a line is there (an older locust
        # without it: the whole body at once, so TTFT then equals the end-to-end latency)
        raw = getattr(resp, "_response", None) or _WholeBody(resp)
        last = None
        chunks = 0
        usage_tokens = None
        while True:
            line = raw.readline(b"\n")
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":  # read on to the end of the body, so the connection can be reused
                continue
            now = time.perf_counter()
            if not _NEEDS_PARSE.search(data):
                # a plain token event (most of them): whether its text is empty is all it can tell, so
                # spare the JSON decoding, a third of this client's CPU per streamed request
                m = _TEXT.search(data)
                if m and m.group(1) != b'"':
                    chunks, last = chunks + 1, _token_arrived(rec, t0, last, now)
                continue
            msg = json.loads(data)
            if msg.get("error"):
                rec["error"] = str(msg["error"])[:200]
            usage = msg.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                usage_tokens = usage["completion_tokens"]
            choices = msg.get("choices") or []
            if choices and choices[0].get("text"):
                chunks, last = chunks + 1, _token_arrived(rec, t0, last, now)
            if msg.get("gpuproof"):
                rec["server"] = msg["gpuproof"]
        rec["e2e_s"] = time.perf_counter() - t0
        rec["tokens"] = usage_tokens if usage_tokens is not None else chunks
        rec["ok"] = rec["error"] is None and rec["ttft_s"] is not None


__all__ = ["PLAN", "Plan", "InferenceUser", "make_prompts", "locust"]
