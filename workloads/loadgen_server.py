"""loadgen's view of the server: is it ready, what model it serves, what its metrics path serves (gpuproof's
JSON or Prometheus gauges, sampled during a step), the server's own busy fractions between two readings, and its
latency with nothing else in flight (the idle probe). Part of loadgen.py (README: "loadgen.py step by step")."""

from __future__ import annotations

import locustfile  # noqa: F401  (first: imports locust, which monkey-patches the standard library)

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import gevent
from gevent.event import Event

import loadclient
import workload_common as common
from loadgen_stats import _server_ms
from locustfile import PLAN


def _get(url: str, timeout: float = 5.0, accept: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def wait_ready(base: str, health_path: str, timeout: float) -> None:
    """Poll the health endpoint until it answers 200, at most ``timeout`` seconds."""
    common.wait_until(lambda: _get(base + health_path, timeout=2.0)[0] == 200, timeout,
                      f"{base}{health_path} to answer 200", interval=0.1)


def served_model(base: str) -> str:
    """The first model id /v1/models lists ('' when it lists none)."""
    code, body = _get(base + "/v1/models")
    if code != 200:
        return ""
    data = json.loads(body).get("data") or []
    return data[0].get("id", "") if data else ""


def probe_metrics(base: str, path: str) -> tuple[str | None, dict | None]:
    """What the endpoint's metrics path serves: ("gpuproof", its JSON), ("prometheus", the gauges
    of :data:`PROM_GAUGES` it has: vLLM, SGLang, TGI), or (None, None)."""
    if not path:
        return None, None
    try:
        # gpuproof's server answers a scraper (text/plain) in the Prometheus format: ask for its JSON by name;
        # vLLM, SGLang and TGI answer text whatever is asked
        code, body = _get(base + path, timeout=5.0, accept="application/json")
    except OSError:
        return None, None
    if code != 200:
        return None, None
    try:
        m = json.loads(body)
    except ValueError:
        gauges = loadclient.prom_gauges(body.decode(errors="replace"))
        return ("prometheus", gauges) if gauges else (None, None)
    return ("gpuproof", m) if isinstance(m, dict) and "process_cpu_s" in m else (None, None)


def server_metrics(base: str, path: str) -> dict | None:
    """gpuproof's JSON /metrics, or None (another server: Prometheus text, 404, ...)."""
    kind, m = probe_metrics(base, path)
    return m if kind == "gpuproof" else None


class GaugeSampler:
    """Reads a Prometheus endpoint's gauges every ``interval`` seconds during a step (a greenlet of
    this process): gauges say how full the server is now, so a step needs samples, not two readings."""

    def __init__(self, url: str, interval: float):
        self.url, self.interval = url, interval
        self.samples: list[dict] = []
        self.stop_event = Event()
        self.greenlet = gevent.spawn(self._run)

    def _read(self) -> None:
        try:
            code, body = _get(self.url, timeout=max(1.0, self.interval))
        except OSError:
            return
        if code == 200:
            g = loadclient.prom_gauges(body.decode(errors="replace"))
            if g:
                self.samples.append(g)

    def _run(self) -> None:
        self._read()
        while not self.stop_event.wait(self.interval):   # the sampling period, not a wait for a condition
            self._read()

    def stop(self) -> dict | None:
        """Stop sampling; the headroom over the samples (see :func:`headroom`)."""
        self.stop_event.set()
        self.greenlet.join(timeout=10)
        self._read()
        return loadclient.prom_headroom(self.samples)


def server_side(m0: dict | None, m1: dict | None) -> dict | None:
    """The server's busy fractions, how full it was, and the per-request time split between two
    gpuproof /metrics readings."""
    if not m0 or not m1:
        return None
    dw = m1["wall_s"] - m0["wall_s"]
    if dw <= 0:
        return None
    e0, e1 = m0.get("engine") or {}, m1.get("engine") or {}
    d = {k: m1.get(k, 0) - m0.get(k, 0) for k in ("ok", "handler_cpu_s", "queue_s", "model_s", "process_cpu_s")}
    busy = e1.get("busy_s", 0) - e0.get("busy_s", 0)
    fwd = e1.get("forward_s", 0) - e0.get("forward_s", 0)
    n = d["ok"]
    out = {
        "cpu_util": d["process_cpu_s"] / dw / max(1e-9, m1.get("cpu_budget_cores") or 1.0),
        "engine_busy": busy / dw,
        "forward_share_of_busy": fwd / busy if busy > 0 else None,
        "requests": n,
        "mean_batch": ((e1.get("batch_rows", 0) - e0.get("batch_rows", 0))
                       / max(1, e1.get("decode_steps", 0) - e0.get("decode_steps", 0))),
    }
    if n:
        handler = d["handler_cpu_s"] / n * 1e3
        sched = (busy - fwd) / n * 1e3
        model = d["model_s"] / n * 1e3
        out.update(handler_cpu_ms=handler, scheduler_ms=sched, overhead_ms=handler + sched, model_ms=model,
                   queue_ms=d["queue_s"] / n * 1e3,
                   overhead_fraction=(handler + sched) / (handler + sched + model) if handler + sched + model > 0
                   else None)
    out.update(loadclient.engine_steps(e0, e1, dw))
    g0, g1 = m0.get("gpu") or {}, m1.get("gpu") or {}
    dn = g1.get("n", 0) - g0.get("n", 0)
    out["gpu_util_pct"] = (g1.get("util_pct_sum", 0) - g0.get("util_pct_sum", 0)) / dn if dn > 0 else None
    return out


def idle_latency(base: str, n: int, timeout: float = 120.0) -> dict:
    """The server's latency with nothing else in flight: ``n`` streamed requests one after another
    (after one more to warm up), median TTFT, whole request and, where the server reports it, its own
    time."""
    u = urllib.parse.urlsplit(base)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    ttfts, e2es, servers, errors = [], [], [], []
    conn = cls(u.hostname, u.port, timeout=timeout)
    try:
        for i in range(n + 1):
            t0 = time.perf_counter()
            conn.request("POST", PLAN.path, PLAN.body(), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                errors.append(f"HTTP {resp.status}")
                resp.read()
                continue
            first, srv = None, None
            while line := resp.readline():
                line = line.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                msg = json.loads(line[5:])
                choices = msg.get("choices") or []
                if first is None and choices and choices[0].get("text"):
                    first = time.perf_counter() - t0
                srv = _server_ms(msg.get("gpuproof")) if msg.get("gpuproof") else srv
            if i and first is not None:   # the first one warms up
                ttfts.append(first * 1e3)
                e2es.append((time.perf_counter() - t0) * 1e3)
                if srv is not None:
                    servers.append(srv)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    return {"n": len(ttfts), "source": f"idle probe ({len(ttfts)} sequential requests, median)",
            "ttft_ms": common.median(ttfts) if ttfts else None,
            "e2e_ms": common.median(e2es) if e2es else None,
            "server_ms": common.median(servers) if len(servers) == len(ttfts) and servers else None,
            "errors": errors[:3]}
