"""HTTP inference server around a small torch MLP, with dynamic batching.

Endpoints:

- ``GET  /healthz``  200 once the model is loaded and warmed up, 503 before (readiness);
- ``GET  /info``     the model's shape and the batching settings (JSON);
- ``GET  /stats``    counters so far (JSON);
- ``POST /infer``    body ``{"inputs": [[x0, ..., x_{in-1}], ...]}`` (one or more rows),
  answer ``{"outputs": [[y0, ...], ...]}``.

Requests are queued; one batching thread takes up to ``--max-batch`` rows, waiting at most
``--max-wait-ms`` after the first one for more, runs one forward pass and answers all of
them. A full queue answers 503 at once (load shedding) rather than letting latency grow
without bound.

Stops on SIGTERM / SIGINT (or after ``--max-seconds``) and then prints one JSON object:
requests, batches, batch sizes, server-side latency percentiles and GPU utilization.
The bound port is written to ``--port-file`` as soon as the socket listens (``--port 0``
picks a free one).
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import nvml_sampler
import workload_common as common

HEALTH_PATH = "/healthz"
INFER_PATH = "/infer"
MAX_BODY = 8 * 2**20
MAX_LATENCIES = 1_000_000  # server-side latencies kept for percentiles (bounded memory)


def build_model(in_features: int, hidden: int, layers: int, out_features: int, device: str, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    mods: list = []
    width = in_features
    for _ in range(layers):
        mods += [torch.nn.Linear(width, hidden), torch.nn.GELU()]
        width = hidden
    mods.append(torch.nn.Linear(width, out_features))
    return torch.nn.Sequential(*mods).to(device).eval()


class _Pending:
    __slots__ = ("rows", "event", "outputs", "error", "t_enqueued")

    def __init__(self, rows):
        self.rows = rows
        self.event = threading.Event()
        self.outputs = None
        self.error = None
        self.t_enqueued = time.perf_counter()


class Batcher:
    """Collects queued requests into batches and runs the model on them in one thread."""

    def __init__(self, model, device: str, in_features: int, max_batch: int, max_wait_s: float, max_queue: int):
        self.model = model
        self.device = device
        self.in_features = in_features
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.queue: queue.Queue[_Pending] = queue.Queue(maxsize=max_queue)
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.batches = 0
        self.rows = 0
        self.batch_hist: dict[int, int] = {}
        self.latencies: list[float] = []
        self.input_dtype = None  # the weights' dtype (torch.float32 unless --dtype says otherwise)
        self.thread = threading.Thread(target=self._run, name="batcher", daemon=True)

    def start(self) -> "Batcher":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=10)

    def submit(self, rows) -> _Pending:
        p = _Pending(rows)
        self.queue.put_nowait(p)  # queue.Full -> the handler answers 503
        return p

    def forward(self, rows: list[list[float]]):
        import torch

        with torch.inference_mode():
            x = torch.tensor(rows, dtype=self.input_dtype or torch.float32).to(self.device, non_blocking=True)
            return self.model(x).float().cpu().tolist()

    def _take_batch(self) -> list[_Pending]:
        try:
            first = self.queue.get(timeout=0.1)
        except queue.Empty:
            return []
        batch, n = [first], len(first.rows)
        deadline = time.perf_counter() + self.max_wait_s
        while n < self.max_batch:
            remaining = deadline - time.perf_counter()
            try:
                p = self.queue.get(timeout=remaining) if remaining > 0 else self.queue.get_nowait()
            except queue.Empty:
                break
            batch.append(p)
            n += len(p.rows)
        return batch

    def _run(self) -> None:
        while not self.stop_event.is_set():
            batch = self._take_batch()
            if not batch:
                continue
            rows = [r for p in batch for r in p.rows]
            try:
                outs = self.forward(rows)
            except Exception as exc:  # answer every waiting request with the error
                for p in batch:
                    p.error = f"{type(exc).__name__}: {exc}"
                    p.event.set()
                continue
            i = 0
            now = time.perf_counter()
            with self.lock:
                self.batches += 1
                self.rows += len(rows)
                self.batch_hist[len(rows)] = self.batch_hist.get(len(rows), 0) + 1
                if len(self.latencies) < MAX_LATENCIES:
                    self.latencies.extend(now - p.t_enqueued for p in batch)
            for p in batch:
                p.outputs = outs[i:i + len(p.rows)]
                i += len(p.rows)
                p.event.set()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # TIME_WAIT only; a port somebody listens on still fails
    request_queue_size = 1024

    def __init__(self, addr, info: dict, request_timeout: float):
        self.batcher: Batcher | None = None  # set once the model is loaded
        self.info = info
        self.request_timeout = request_timeout
        self.ready = threading.Event()
        self.counts = {"requests": 0, "ok": 0, "errors": 0, "rejected": 0}
        self.counts_lock = threading.Lock()
        super().__init__(addr, Handler)

    def count(self, key: str) -> None:
        with self.counts_lock:
            self.counts[key] += 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection carries many requests
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall
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

    def do_GET(self):
        if self.path == HEALTH_PATH:
            if self.server.ready.is_set():
                self._send(200, {"status": "ok"})
            else:
                self._send(503, {"status": "loading"})
        elif self.path == "/info":
            self._send(200, self.server.info)
        elif self.path == "/stats":
            self._send(200, stats(self.server))
        else:
            self._send(404, {"error": f"no such path {self.path}"})

    def do_POST(self):
        if self.path != INFER_PATH:
            self._send(404, {"error": f"no such path {self.path}"})
            return
        srv = self.server
        srv.count("requests")
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            srv.count("errors")
            self._send(400 if length <= 0 else 413, {"error": "body must be 1 byte to 8 MiB of JSON"})
            return
        try:
            rows = json.loads(self.rfile.read(length))["inputs"]
            width = srv.info["in_features"]
            if not rows or any(len(r) != width for r in rows):
                raise ValueError(f"every input row needs {width} numbers")
        except (ValueError, KeyError, TypeError) as exc:
            srv.count("errors")
            self._send(400, {"error": f"bad request: {exc}"})
            return
        if not srv.ready.is_set():
            srv.count("rejected")
            self._send(503, {"error": "model is not ready"})
            return
        try:
            pending = srv.batcher.submit(rows)
        except queue.Full:
            srv.count("rejected")
            self._send(503, {"error": "queue full"})
            return
        if not pending.event.wait(srv.request_timeout):
            srv.count("errors")
            self._send(504, {"error": f"no answer within {srv.request_timeout}s"})
            return
        if pending.error:
            srv.count("errors")
            self._send(500, {"error": pending.error})
            return
        srv.count("ok")
        self._send(200, {"outputs": pending.outputs})


def stats(srv: Server) -> dict:
    b = srv.batcher
    lat, hist, batches, rows = [], {}, 0, 0
    if b is not None:
        with b.lock:
            lat = list(b.latencies)
            hist = dict(b.batch_hist)
            batches, rows = b.batches, b.rows
    with srv.counts_lock:
        counts = dict(srv.counts)
    return {
        **counts,
        "batches": batches,
        "rows": rows,
        "mean_batch_size": rows / batches if batches else None,
        "batch_size_hist": {str(k): v for k, v in sorted(hist.items())},
        "queue_depth": b.queue.qsize() if b is not None else 0,
        "server_latency_ms": {f"p{q}": (common.percentile(lat, q) or 0) * 1e3 if lat else None
                              for q in (50, 90, 95, 99)},
    }


def build_parser():
    p = common.parser(
        "inference_server.py",
        "HTTP inference server (torch MLP) with dynamic batching; prints a JSON summary when stopped.",
        epilog="examples:\n"
               "  python inference_server.py --port 8000                 # 127.0.0.1:8000\n"
               "  python inference_server.py --host 0.0.0.0 --port 8000  # in a pod\n"
               "  python inference_server.py --port 0 --port-file /tmp/port --device cpu\n",
    )
    common.add_device_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    p.add_argument("--port-file", default=None, help="write the bound port here once listening")
    p.add_argument("--in-features", type=int, default=256, help="model input width (default 256)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden width (default 1024)")
    p.add_argument("--layers", type=int, default=2, help="hidden layers (default 2)")
    p.add_argument("--out-features", type=int, default=16, help="model output width (default 16)")
    p.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default="fp32",
                   help="model weights dtype (default fp32; fp16/bf16 on GPUs)")
    p.add_argument("--max-batch", type=int, default=32, help="rows per forward pass at most (default 32)")
    p.add_argument("--max-wait-ms", type=float, default=2.0,
                   help="how long the first request of a batch waits for company (default 2 ms)")
    p.add_argument("--max-queue", type=int, default=4096, help="queued requests before 503 (default 4096)")
    p.add_argument("--request-timeout", type=float, default=30.0, help="seconds before a queued request gets 504")
    p.add_argument("--max-seconds", type=float, default=0.0, help="stop by itself after this long (0 = never)")
    nvml_sampler.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_batch < 1 or args.max_wait_ms < 0 or not 0 <= args.port <= 65535:
        return common.fail_usage("--max-batch >= 1, --max-wait-ms >= 0 and 0 <= --port <= 65535 please")
    info = {
        "dtype": args.dtype, "in_features": args.in_features, "hidden": args.hidden, "layers": args.layers,
        "out_features": args.out_features, "max_batch": args.max_batch, "max_wait_ms": args.max_wait_ms,
    }
    # bind first: a port in use fails at once, before the model is loaded
    try:
        server = Server((args.host, args.port), info, args.request_timeout)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return common.fail_usage(f"port {args.port} on {args.host} is already in use; "
                                     "pick another with --port (0 = any free port)")
        return common.fail_usage(f"cannot listen on {args.host}:{args.port}: {exc}")
    port = server.server_address[1]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    serve.start()  # /healthz answers 503 until the model is ready
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as fh:
            fh.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    common.log(f"listening on http://{args.host}:{port}; loading the model")

    import torch

    device = common.setup_device(args)
    model = build_model(args.in_features, args.hidden, args.layers, args.out_features, device)
    if args.dtype != "fp32":
        model = model.to({"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype])
    info.update(device=device, device_name=common.device_name(device))
    batcher = Batcher(model, device, args.in_features, args.max_batch, args.max_wait_ms / 1e3, args.max_queue)
    batcher.input_dtype = next(model.parameters()).dtype
    server.batcher = batcher
    sampler = nvml_sampler.make_sampler(args.sample_hz, torch_device=device).start()
    t_start = time.time()
    with sampler.phase("warmup"):
        for n in sorted({1, args.max_batch}):
            batcher.forward([[0.5] * args.in_features] * n)
        common.sync(device)
    batcher.start()
    server.ready.set()
    common.log(f"ready on {device}: GET {HEALTH_PATH} answers 200")
    with sampler.phase("serve"):
        stop.wait(args.max_seconds if args.max_seconds > 0 else None)
    common.log("stopping")
    server.shutdown()
    server.server_close()
    batcher.stop()
    summary = nvml_sampler.finish(sampler, args)
    result = common.base_result("inference_server")
    result.update(info, port=port, uptime_s=time.time() - t_start, torch=torch.__version__,
                  stats=stats(server), utilization=summary, ok=True)
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
