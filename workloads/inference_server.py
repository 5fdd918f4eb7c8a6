"""LLM-shaped inference server: a decoder-only transformer (``llm_model.py``) behind an
OpenAI-compatible HTTP API, with a KV cache and continuous batching.

Long: one standalone script a pod runs (no gpuproof import): the HTTP API, its two metrics
formats, the engine's startup and the summary.

Endpoints (the same a client uses against vLLM, TGI, SGLang or NIM):

- ``POST /v1/completions``: ``{"model", "prompt": "text" | [token ids], "max_tokens",
  "stream", "ignore_eos", "min_tokens", "stream_options": {"include_usage": true}}``.
  Streamed: Server-Sent Events over chunked HTTP/1.1, one ``data: {...}`` chunk per
  token, a last chunk with ``finish_reason`` (and ``usage``), then ``data: [DONE]``. Not
  streamed: one ``text_completion`` object with ``usage``. Prompts are split into one
  token per word (the model's weights are random; what matters is the work).
  Both forms carry a non-standard ``gpuproof`` object with the server's own timing of
  the request (queue, model and handler CPU milliseconds).
- ``GET /v1/models``: the one model, with its ``max_model_len``.
- ``GET /health`` and ``GET /healthz``: 200 once the model is loaded and warmed up, 503 before.
- ``GET /metrics``: JSON counters for the client's capacity search: process CPU seconds,
  the engine's forward (model) and busy seconds, its steps with the server's CPU and the
  device's seconds over them (``llm_step.StepClock``), summed per-request handler CPU, queue
  and model time, tokens, the NVML samples' GPU utilization so far, and how full the
  engine is: ``running`` and ``waiting`` now, ``max_batch`` (its batch slots) and the
  running/waiting requests summed over time (``engine.running_s``/``waiting_s``). A client takes
  two readings and divides the differences (see ``loadgen.py``). The same path speaks the
  Prometheus text format (0.0.4) to a scraper: when the Accept header prefers ``text/plain`` or
  ``application/openmetrics-text`` to ``application/json`` (Prometheus sends
  ``application/openmetrics-text;...,text/plain;version=0.0.4;q=0.5,*/*;q=0.1``), the answer is
  series named in vLLM's and TGI's manner (:data:`PROM_SERIES`: ``gpuproof_inference_requests_total``,
  tokens, requests running and waiting, ...), each with ``# HELP`` and ``# TYPE``. No Accept, ``*/*``
  or ``application/json`` get the JSON (gpuproof's own readers ask for it by name).

The model's size comes from ``--model`` (a preset; ``auto`` = sized from the GPU's
memory, ``cpu`` on the CPU) or ``--layers/--hidden/--heads/--vocab``; the KV cache has
``--max-batch`` slots of ``--max-seq`` tokens (fewer slots when the GPU's memory does
not hold them). On a GPU the decode step is a CUDA graph replay (``--cuda-graphs``, ``llm_step.GraphDecoder``).

Stops on SIGTERM / SIGINT (or after ``--max-seconds``) and prints one JSON summary. The
bound port is written to ``--port-file`` once the socket listens (``--port 0`` = a free port).
"""

from __future__ import annotations

import errno
import json
import os
import queue
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import llm_model
import llm_step
import nvml_sampler
import workload_common as common

HEALTH_PATHS = ("/health", "/healthz")
MAX_BODY = 8 * 2**20


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # TIME_WAIT only; a port somebody listens on still fails
    request_queue_size = 1024

    def __init__(self, addr, request_timeout: float):
        self.engine: llm_model.Engine | None = None  # set once the model is loaded
        self.info: dict = {}
        self.model_name = "gpuproof-llm"
        self.request_timeout = request_timeout
        self.ready = threading.Event()
        self.sampler = None
        self.t0 = time.monotonic()
        self.cpu_budget = 1.0
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "ok": 0, "errors": 0, "rejected": 0, "prompt_tokens": 0,
                       "completion_tokens": 0, "handler_cpu_s": 0.0, "queue_s": 0.0, "model_s": 0.0,
                       "server_s": 0.0}
        super().__init__(addr, Handler)

    def handle_error(self, request, client_address) -> None:
        """A client that went away is not worth a traceback; anything else is."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, TimeoutError)):
            super().handle_error(request, client_address)

    def add(self, **kw) -> None:
        with self.lock:
            for k, v in kw.items():
                self.counts[k] += v


def gpu_util_so_far(sampler) -> dict:
    """Sum and count of the NVML GPU-utilization samples taken so far (for /metrics deltas)."""
    rows = list(getattr(sampler, "samples", None) or [])
    vals = [r["gpu_util_pct"] for r in rows if r.get("gpu_util_pct") is not None]
    return {"available": bool(getattr(sampler, "available", False)), "util_pct_sum": float(sum(vals)),
            "n": len(vals)}


def metrics(srv: Server) -> dict:
    with srv.lock:
        counts = dict(srv.counts)
    eng = srv.engine
    waiting, running = eng.depth() if eng else (0, 0)
    return {
        "server": "gpuproof",
        "wall_s": time.monotonic() - srv.t0,
        "process_cpu_s": time.process_time(),
        "cpu_budget_cores": srv.cpu_budget,
        **counts,
        "waiting": waiting,
        "running": running,
        "max_batch": eng.model.slots if eng else None,
        "engine": eng.snapshot() if eng else {},
        "gpu": gpu_util_so_far(srv.sampler),
        "ready": srv.ready.is_set(),
    }


PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROM_TYPES = ("text/plain", "application/openmetrics-text")
# name -> (type, help, how to read it from metrics()): gpuproof's series, in vLLM's (vllm:request_success_total,
# vllm:generation_tokens_total, vllm:num_requests_running) and TGI's (tgi_request_count, tgi_queue_size) manner
PROM_SERIES = {
    "gpuproof_inference_requests_total": (
        "counter", "Completion requests received (POST /v1/completions), answered or not.", lambda m: m["requests"]),
    "gpuproof_inference_request_success_total": (
        "counter", "Completion requests answered in full.", lambda m: m["ok"]),
    "gpuproof_inference_request_errors_total": (
        "counter", "Completion requests that failed: a bad request, or an error while generating.",
        lambda m: m["errors"]),
    "gpuproof_inference_request_rejected_total": (
        "counter", "Completion requests refused with 503: the model not ready, or the queue full.",
        lambda m: m["rejected"]),
    "gpuproof_inference_prompt_tokens_total": (
        "counter", "Prompt tokens of the requests answered.", lambda m: m["prompt_tokens"]),
    "gpuproof_inference_generation_tokens_total": (
        "counter", "Tokens generated for the requests answered.", lambda m: m["completion_tokens"]),
    "gpuproof_inference_requests_running": (
        "gauge", "Requests in the engine's batch now.", lambda m: m["running"]),
    "gpuproof_inference_requests_waiting": (
        "gauge", "Requests waiting for a batch slot now.", lambda m: m["waiting"]),
    "gpuproof_inference_batch_slots": (
        "gauge", "The engine's batch slots (KV-cache slots).", lambda m: m["max_batch"]),
    "gpuproof_inference_queue_seconds_total": (
        "counter", "Seconds the answered requests waited for a batch slot, summed.", lambda m: m["queue_s"]),
    "gpuproof_inference_model_seconds_total": (
        "counter", "Seconds of the model's forward passes spent on the answered requests, summed.",
        lambda m: m["model_s"]),
    "gpuproof_inference_engine_busy_seconds_total": (
        "counter", "Seconds the engine's scheduler was busy.", lambda m: (m.get("engine") or {}).get("busy_s")),
    "gpuproof_inference_ready": (
        "gauge", "1 once the model is loaded and warmed up (GET /health answers 200).", lambda m: m.get("ready")),
    "process_cpu_seconds_total": (
        "counter", "User and system CPU seconds of the server's process.", lambda m: m["process_cpu_s"]),
}


def _quality(param: str) -> float:
    for p in param.split(";")[1:]:
        key, _, value = p.strip().partition("=")
        if key.strip().lower() == "q":
            try:
                return max(0.0, min(1.0, float(value)))
            except ValueError:
                return 0.0
    return 1.0


def wants_prometheus(accept: str | None) -> bool:
    """Does this Accept header prefer the Prometheus text format (``text/plain`` or OpenMetrics, answered with
    text 0.0.4) to JSON? No header, ``*/*`` and ``application/json`` get JSON; a tie goes to JSON too."""
    text_q = json_q = 0.0
    for part in (accept or "").split(","):
        kind = part.split(";")[0].strip().lower()
        if kind in PROM_TYPES:
            text_q = max(text_q, _quality(part))
        elif kind == "application/json":
            json_q = max(json_q, _quality(part))
    return text_q > json_q


def _label_value(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    return repr(float(value))  # repr: the shortest text that reads back the same; inf and nan as Prometheus has them


def prometheus_text(m: dict, model: str) -> str:
    """:func:`metrics`' reading as the Prometheus text format 0.0.4: the series of :data:`PROM_SERIES`, each with
    ``# HELP`` and ``# TYPE`` and the label ``model_name`` (vLLM's), and ``gpuproof_inference_info``."""
    labels = f'{{model_name="{_label_value(model)}"}}'
    lines = []
    for name, (kind, text, read) in PROM_SERIES.items():
        value = read(m)
        if value is None:
            continue
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}",
                  f"{name}{'' if name.startswith('process_') else labels} {_number(value)}"]
    lines += ["# HELP gpuproof_inference_info The server: its model, device and batch slots, in labels.",
              "# TYPE gpuproof_inference_info gauge",
              f'gpuproof_inference_info{{model_name="{_label_value(model)}",server="gpuproof",'
              f'max_batch="{_label_value(m.get("max_batch") if m.get("max_batch") is not None else "")}"}} 1']
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streamed answers use chunked transfer encoding
    disable_nagle_algorithm = True
    server: Server

    def log_message(self, fmt, *args):  # one line per request would swamp stderr
        pass

    def _send(self, code: int, payload: dict) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_text(self, code: int, text: str, content_type: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, message: str, key: str = "errors") -> None:
        self.server.add(**{key: 1})
        self._send(code, {"error": {"message": message, "type": "invalid_request_error" if code < 500
                                    else "server_error", "code": code}})

    def do_GET(self):
        srv = self.server
        path = self.path.split("?")[0]
        if path in HEALTH_PATHS:
            self._send(200, {"status": "ok"}) if srv.ready.is_set() else self._send(503, {"status": "loading"})
        elif path == "/v1/models":
            if not srv.ready.is_set():
                self._send(503, {"error": {"message": "the model is loading", "code": 503}})
                return
            self._send(200, {"object": "list", "data": [{
                "id": srv.model_name, "object": "model", "created": int(time.time()), "owned_by": "gpuproof",
                "max_model_len": srv.info.get("max_seq")}]})
        elif path == "/metrics":
            if wants_prometheus(self.headers.get("Accept")):
                self._send_text(200, prometheus_text(metrics(srv), srv.model_name), PROM_CONTENT_TYPE)
            else:
                self._send(200, metrics(srv))
        elif path == "/info":
            self._send(200, srv.info)
        else:
            self._send(404, {"error": {"message": f"no such path {self.path}", "code": 404}})

    def _parse(self) -> tuple[dict, list[int]]:
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            raise ValueError("the body must be 1 byte to 8 MiB of JSON")
        body = json.loads(self.rfile.read(length))
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        vocab = self.server.info["vocab"]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            tokens = llm_model.tokenize(prompt, vocab)
        elif isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < vocab for t in prompt):
            tokens = list(prompt)
        else:
            raise ValueError(f"prompt must be a string or a list of token ids below {vocab}")
        if not tokens:
            raise ValueError("the prompt is empty")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError("max_tokens must be an integer >= 1")
        if len(tokens) + max_tokens > self.server.info["max_seq"]:
            raise ValueError(f"prompt ({len(tokens)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
                             f"context of {self.server.info['max_seq']} tokens")
        return body, tokens

    def do_POST(self):
        srv = self.server
        path = self.path.split("?")[0]
        if path != "/v1/completions":
            self._send(404, {"error": {"message": f"no such path {self.path}", "code": 404}})
            return
        cpu0, t0 = time.thread_time(), time.perf_counter()
        srv.add(requests=1)
        try:
            body, tokens = self._parse()
        except (ValueError, TypeError) as exc:
            self._error(400, f"bad request: {exc}")
            return
        if not srv.ready.is_set():
            self._error(503, "the model is not ready", "rejected")
            return
        req = llm_model.Request(tokens, body.get("max_tokens", 16), int(body.get("min_tokens") or 0),
                                bool(body.get("ignore_eos")))
        try:
            srv.engine.submit(req)
        except queue.Full:
            self._error(503, "queue full", "rejected")
            return
        rid = f"cmpl-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        if body.get("stream"):
            ok = self._stream(req, rid, created, body)
        else:
            ok = self._whole(req, rid, created)
        srv.add(ok=1 if ok else 0, errors=0 if ok else 1, prompt_tokens=len(tokens),
                completion_tokens=req.generated, handler_cpu_s=time.thread_time() - cpu0,
                queue_s=((req.t_admit or t0) - req.t_submit), model_s=req.model_s,
                server_s=time.perf_counter() - t0)

    def _tokens(self, req):
        """The request's tokens as the engine makes them, several at a time when they queue up."""
        while True:
            try:
                tok = req.out.get(timeout=self.server.request_timeout)
            except queue.Empty:
                req.error = req.error or f"no token within {self.server.request_timeout}s"
                return
            batch = [tok]
            while tok is not None:
                try:
                    tok = req.out.get_nowait()
                except queue.Empty:
                    break
                batch.append(tok)
            done = batch[-1] is None
            toks = [t for t in batch if t is not None]
            if toks:
                yield toks
            if done:
                return

    def _timing(self, req) -> dict:
        return {"queue_ms": ((req.t_admit or req.t_submit) - req.t_submit) * 1e3, "model_ms": req.model_s * 1e3}

    def _whole(self, req, rid, created) -> bool:
        text = "".join(llm_model.detokenize(t) for toks in self._tokens(req) for t in toks)
        if req.error:
            self._send(500, {"error": {"message": req.error, "type": "server_error", "code": 500}})
            return False
        n_prompt = len(req.prompt)
        self._send(200, {"id": rid, "object": "text_completion", "created": created, "model": self.server.model_name,
                         "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish}],
                         "usage": {"prompt_tokens": n_prompt, "completion_tokens": req.generated,
                                   "total_tokens": n_prompt + req.generated},
                         "gpuproof": self._timing(req)})
        return True

    def _chunk(self, payloads: list) -> None:
        data = b"".join(b"data: " + (p if isinstance(p, bytes) else json.dumps(p, separators=(",", ":")).encode())
                        + b"\n\n" for p in payloads)
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _stream(self, req, rid, created, body) -> bool:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        model = self.server.model_name
        head = {"id": rid, "object": "text_completion", "created": created, "model": model}
        # a token's event is the same bytes but for its text: build the rest once per request
        pre = json.dumps(head, separators=(",", ":"))[:-1].encode() + b',"choices":[{"index":0,"text":'
        post = b',"logprobs":null,"finish_reason":null}]}'
        try:
            for toks in self._tokens(req):
                self._chunk([pre + json.dumps(llm_model.detokenize(t)).encode() + post for t in toks])
            last: list = []
            if req.error:
                last.append({**head, "error": {"message": req.error, "code": 500}})
            else:
                n_prompt = len(req.prompt)
                usage = {"prompt_tokens": n_prompt, "completion_tokens": req.generated,
                         "total_tokens": n_prompt + req.generated}
                final = {**head, "choices": [{"index": 0, "text": "", "logprobs": None,
                                              "finish_reason": req.finish}], "gpuproof": self._timing(req)}
                if (body.get("stream_options") or {}).get("include_usage"):
                    last += [final, {**head, "choices": [], "usage": usage}]
                else:
                    last.append(final)
            last.append(b"[DONE]")
            self._chunk(last)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return False
        return req.error is None


def resolve_size(args, device: str) -> tuple[str, int, int, int, int]:
    preset = llm_model.auto_preset(device) if args.model == "auto" else args.model
    layers, hidden, heads, vocab = llm_model.PRESETS[preset]
    return (preset if not any((args.layers, args.hidden, args.heads, args.vocab)) else f"{preset}+custom",
            args.layers or layers, args.hidden or hidden, args.heads or heads, args.vocab or vocab)


def kv_slots(args, device: str, layers: int, hidden: int, dtype_bytes: int, weight_bytes: int) -> int:
    """Cache slots: --max-batch, fewer if the GPU's free memory (after the weights) cannot hold them."""
    if not device.startswith("cuda"):
        return args.max_batch
    import torch

    free, _ = torch.cuda.mem_get_info()
    budget = (free - weight_bytes) * args.kv_mem_fraction
    per_slot = llm_model.LLM.kv_bytes_per_token(layers, hidden, dtype_bytes) * args.max_seq
    return max(1, min(args.max_batch, int(budget // per_slot)))


def per_step(served: dict, eng: dict) -> dict:
    """The engine's steps after the warm-up: the server's CPU and the device's time per step (``llm_step``), their
    ratio (>= ~1 on a GPU: the server's Python keeps the GPU waiting), tokens per step, and the device's share of
    the steps' wall time."""
    steps = served["steps"]
    return {"steps": steps, "device_timer": eng.get("device_timer"), "cuda_graphs": eng.get("cuda_graphs"),
            "cpu_ms": served["cpu_s"] / steps * 1e3 if steps else None,
            "device_ms": served["device_s"] / steps * 1e3 if steps else None,
            "cpu_per_device": served["cpu_s"] / served["device_s"] if served["device_s"] > 0 else None,
            "tokens_per_step": (served["prefill_tokens"] + served["decode_tokens"]) / steps if steps else None,
            "device_share_of_busy": served["device_s"] / served["busy_s"] if served["busy_s"] > 0 else None}


def build_parser():
    p = common.parser(
        "inference_server.py",
        "OpenAI-compatible LLM server (decoder-only transformer, random weights, KV cache, continuous "
        "batching, streamed tokens); prints a JSON summary when stopped.",
        epilog="examples:\n"
               "  python inference_server.py --port 8000                    # 127.0.0.1:8000, sized from the GPU\n"
               "  python inference_server.py --host 0.0.0.0 --port 8000     # in a pod\n"
               "  python inference_server.py --device cpu --port 0 --port-file /tmp/port\n"
               "  curl -N 127.0.0.1:8000/v1/completions -d '{\"prompt\": \"hi there\", \"max_tokens\": 8, "
               "\"stream\": true}'\n",
    )
    common.add_device_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--model", choices=("auto", *llm_model.PRESETS), default="auto",
                   help="model size preset (default auto: from the GPU's memory; 'cpu' on the CPU)")
    p.add_argument("--model-name", default="gpuproof-llm", help="the model id /v1/models reports")
    p.add_argument("--layers", type=int, default=0, help="override the preset's layers")
    p.add_argument("--hidden", type=int, default=0, help="override the preset's hidden width")
    p.add_argument("--heads", type=int, default=0, help="override the preset's attention heads")
    p.add_argument("--vocab", type=int, default=0, help="override the preset's vocabulary size")
    p.add_argument("--max-seq", type=int, default=0,
                   help="context length: prompt + output tokens (default 2048 on a GPU, 512 on the CPU)")
    p.add_argument("--max-batch", type=int, default=0,
                   help="sequences decoded together at most = KV-cache slots (default 64 on a GPU, 16 on the CPU)")
    p.add_argument("--max-prefill-tokens", type=int, default=8192,
                   help="prompt tokens admitted per scheduler step at most (default 8192)")
    p.add_argument("--kv-mem-fraction", type=float, default=0.7,
                   help="share of the GPU's free memory (after the weights) the KV cache may use (default 0.7)")
    p.add_argument("--max-queue", type=int, default=4096, help="waiting requests before 503 (default 4096)")
    p.add_argument("--request-timeout", type=float, default=120.0,
                   help="seconds a request may wait for its next token before it fails (default 120)")
    p.add_argument("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
                   help="decode steps as CUDA graph replays (default auto: on a GPU; off on the CPU, where 'on' "
                        "is an error); a capture that fails falls back to eager decoding, said in the summary")
    p.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    p.add_argument("--max-seconds", type=float, default=0.0, help="stop by itself after this long (0 = never)")
    nvml_sampler.add_args(p)
    return p


# How often the main thread wakes while it waits for SIGTERM. The kernel may deliver the signal to any thread
# (the engine's, the sampler's, CUDA's); there it only sets Python's flag, and the handler runs when the main
# thread next runs Python code: an Event.wait() with no timeout then never returns. On an H200 the server
# ignored SIGTERM for 60 s, and gpuproof bench lost the whole run with it.
SIGNAL_CHECK_S = 0.5


def wait_for_stop(stop: threading.Event, max_seconds: float = 0.0) -> None:
    """Until ``stop`` is set (by SIGTERM / SIGINT) or ``max_seconds`` (> 0) have passed."""
    deadline = time.monotonic() + max_seconds if max_seconds > 0 else None
    while not stop.is_set():
        left = SIGNAL_CHECK_S if deadline is None else min(SIGNAL_CHECK_S, deadline - time.monotonic())
        if left <= 0:
            return
        stop.wait(left)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_batch < 0 or args.max_seq < 0 or args.max_seq == 1 or not 0 <= args.port <= 65535:
        return common.fail_usage("--max-batch >= 1, --max-seq >= 2 and 0 <= --port <= 65535 please")
    # bind first: a port in use fails at once, before the model is loaded
    try:
        server = Server((args.host, args.port), args.request_timeout)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return common.fail_usage(f"port {args.port} on {args.host} is already in use; "
                                     "pick another with --port (0 = any free port)")
        return common.fail_usage(f"cannot listen on {args.host}:{args.port}: {exc}")
    server.model_name = args.model_name
    port = server.server_address[1]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serve.start()  # /health answers 503 until the model is ready
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as fh:
            fh.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    common.log(f"listening on http://{args.host}:{port}; loading the model")

    import torch

    device = common.setup_device(args)
    preset, layers, hidden, heads, vocab = resolve_size(args, device)
    args.max_seq = args.max_seq or (2048 if device == "cuda" else 512)
    args.max_batch = args.max_batch or (64 if device == "cuda" else 16)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    dtype_bytes = 2 if device == "cuda" else 4
    weight_bytes = llm_model.param_count(layers, hidden, vocab, args.max_seq) * dtype_bytes
    slots = kv_slots(args, device, layers, hidden, dtype_bytes, weight_bytes)
    try:
        model = llm_model.LLM(layers, hidden, heads, vocab, args.max_seq, slots, device=device, dtype=dtype,
                              seed=args.seed)
    except (ValueError, RuntimeError) as exc:
        server.server_close()
        return common.fail_usage(f"cannot build the model ({preset}: {layers} layers, hidden {hidden}): {exc}")
    use_graphs = args.cuda_graphs == "on" or args.cuda_graphs == "auto" and device.startswith("cuda")
    if use_graphs and not device.startswith("cuda"):
        server.server_close()
        return common.fail_usage("--cuda-graphs on needs a CUDA device")
    graphs, graphs_error = None, None
    if use_graphs:
        t_cap = time.perf_counter()
        try:
            graphs = llm_step.GraphDecoder(model)
            common.log(f"captured {graphs.capture_all()} CUDA graphs of the decode step (batch {graphs.batch_sizes}, "
                       f"span {graphs.spans}) in {time.perf_counter() - t_cap:.1f} s")
        except Exception as exc:  # eager decoding still serves; the summary says why the graphs are off
            graphs_error = f"{type(exc).__name__}: {exc}"
            common.log(f"CUDA graphs failed, decoding eagerly: {graphs_error}")
    engine = llm_model.Engine(model, args.max_prefill_tokens, args.max_queue, graphs=graphs)
    engine.graphs_error = graphs_error
    server.engine = engine
    server.info = {"model": args.model_name, "preset": preset, "layers": layers, "hidden": hidden, "heads": heads,
                   "vocab": vocab, "max_seq": args.max_seq, "max_batch": slots, "params": model.n_params,
                   "dtype": str(dtype).replace("torch.", ""), "device": device,
                   "device_name": common.device_name(device), "threads": torch.get_num_threads()}
    # the server's CPU is saturated at one core on a GPU (one Python process, one GIL), at
    # torch's thread count on the CPU (the model's compute runs there)
    server.cpu_budget = float(torch.get_num_threads()) if device == "cpu" else 1.0
    sampler = nvml_sampler.make_sampler(args.sample_hz, torch_device=device).start()
    server.sampler = sampler
    common.log(f"model {preset}: {layers} layers, hidden {hidden}, {heads} heads, vocab {vocab}, "
               f"{model.n_params / 1e6:.1f}M parameters, {slots} KV slots of {args.max_seq} tokens on {device}")
    t_start = time.time()
    with sampler.phase("warmup"):
        warm = [llm_model.Request([1] * 8, 4, ignore_eos=True) for _ in range(min(slots, 4))]
        engine.start()
        for r in warm:
            engine.submit(r)
        for r in warm:
            while r.out.get(timeout=600) is not None:
                pass
        common.sync(device)
    engine_warm = engine.snapshot()
    server.ready.set()
    common.log(f"ready on {device}: GET /health answers 200, POST /v1/completions")
    with sampler.phase("serve"):
        wait_for_stop(stop, args.max_seconds)
    common.log("stopping")
    server.shutdown()
    server.server_close()
    engine.stop()
    summary = nvml_sampler.finish(sampler, args)
    result = common.base_result("inference_server")
    m = metrics(server)
    eng = m["engine"]
    served = {k: eng.get(k, 0) - engine_warm.get(k, 0)
              for k in ("forward_s", "busy_s", "steps", "cpu_s", "device_s", "prefill_tokens", "decode_tokens")}
    ok = m["ok"] or 1
    result.update(server.info, port=port, uptime_s=time.time() - t_start, torch=torch.__version__,
                  stats={k: m[k] for k in ("requests", "ok", "errors", "rejected", "prompt_tokens",
                                           "completion_tokens")},
                  engine=eng,
                  per_request_ms={"handler_cpu": m["handler_cpu_s"] / ok * 1e3, "queue": m["queue_s"] / ok * 1e3,
                                  "model": m["model_s"] / ok * 1e3,
                                  "scheduler": (served["busy_s"] - served["forward_s"]) / ok * 1e3},
                  per_step=per_step(served, eng), process_cpu_s=m["process_cpu_s"], utilization=summary, ok=True)
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
