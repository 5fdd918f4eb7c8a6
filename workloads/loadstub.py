"""A fast stand-in endpoint for measuring the load client itself (not a server benchmark).

It answers ``POST /v1/completions`` with the same shape of streamed answer an
OpenAI-compatible server sends (``max_tokens`` SSE events, one HTTP chunk each, a final
event with ``finish_reason`` and gpuproof's ``queue_ms``/``model_ms`` of zero, the usage
event when asked, ``data: [DONE]``), so a client's CPU per request against it is what the
same client spends per request against a real server; but it computes nothing and builds
each distinct answer once, so it costs far less CPU per request than the client does.
``loadgen.py`` calibrates its per-core rate against it; ``benchmarks/load_client.py``
compares generators on it.

One asyncio process on one thread (HTTP/1.1 keep-alive, ``Content-Length`` request bodies).
``--token-gap-ms G`` writes each token of a streamed answer on its own, G ms apart, as a
server does while it generates: the client then reads one event per socket read, not many.
Known delays, so that a client's figures can be checked against them (``tests/test_aiperf_parity.py``):
``--ttft-ms T`` writes the first token T ms after the answer starts, and ``--service-rps S``
is a queue with a fixed service rate: answers start in arrival order, at most S per second
(answer k starts at max(its arrival, start of k-1 + 1/S)), so past S requests per second the
stub completes S per second and the rest wait. Every delay is kept on an absolute schedule
(token k at start + T + (k-1) G), so a late wake-up does not add up over an answer. The
answer's end (final event, usage, ``[DONE]``) goes with its last token: time per output
token = G exactly.
Also: ``GET /`` (2 bytes), ``GET /v1/models``, ``/health``, ``/healthz``, and ``GET /stats``
(requests served, its own CPU seconds; not counted). ``--port 0 --port-file F`` picks a
free port; SIGTERM or SIGINT prints the summary (one JSON object) and exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
import time

import workload_common as common

HEAD_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _chunk(event: bytes) -> bytes:
    data = b"data: " + event + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_parts(tokens: int, usage: bool, prompt_tokens: int = 0) -> list[bytes]:
    """The streamed answer of ``tokens`` tokens as the pieces a server writes: headers and the
    first token, then one piece per further token, the last one with the end (final event,
    usage, [DONE])."""
    head = b'{"id":"cmpl-stub","object":"text_completion","created":0,"model":"stub",'
    out = [HEAD_SSE]
    for i in range(tokens):
        out.append(_chunk(head + b'"choices":[{"index":0,"text":" w%d","logprobs":null,"finish_reason":null}]}'
                          % (i % 100)))
    out.append(_chunk(head + b'"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}],'
                             b'"gpuproof":{"queue_ms":0.0,"model_ms":0.0}}'))
    if usage:
        out.append(_chunk(head + b'"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,'
                                 b'"total_tokens":%d}}' % (prompt_tokens, tokens, prompt_tokens + tokens)))
    end = b"".join(out[1 + tokens:] + [_chunk(b"[DONE]"), b"0\r\n\r\n"])
    pieces = [out[0] + out[1]] + out[2:1 + tokens]
    pieces[-1] += end
    return pieces


def sse_answer(tokens: int, usage: bool, prompt_tokens: int = 0) -> bytes:
    """The whole streamed answer in one piece, headers included."""
    return b"".join(sse_parts(tokens, usage, prompt_tokens))


def json_answer(obj, status: bytes = b"200 OK") -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return (b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(body), body))


class Stub:
    def __init__(self, token_gap_s: float = 0.0, ttft_s: float = 0.0, service_rps: float = 0.0):
        self.token_gap_s, self.ttft_s = token_gap_s, ttft_s
        self.service_s = 1.0 / service_rps if service_rps > 0 else 0.0
        self.paced = token_gap_s > 0 or ttft_s > 0 or service_rps > 0
        self.next_start = 0.0           # the queue: when the next answer may start (loop time)
        self.answered = 0               # streamed answers written to their end
        self.requests = 0
        self.connections = 0
        self.t0 = time.perf_counter()
        self.cpu0 = _cpu_s()
        self.cache: dict[tuple, bytes] = {}
        self.fixed = {b"/": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok",
                      b"/health": json_answer({"status": "ok"}), b"/healthz": json_answer({"status": "ok"}),
                      b"/v1/models": json_answer({"object": "list", "data": [{"id": "stub", "object": "model"}]})}

    def summary(self) -> dict:
        wall = time.perf_counter() - self.t0
        cpu = _cpu_s() - self.cpu0
        return {"requests": self.requests, "answered": self.answered, "connections": self.connections,
                "wall_s": wall, "cpu_s": cpu,
                "cpu_per_request_us": cpu / self.requests * 1e6 if self.requests else None,
                "ttft_ms": self.ttft_s * 1e3, "token_gap_ms": self.token_gap_s * 1e3,
                "service_rps": 1.0 / self.service_s if self.service_s else None}

    def start_at(self, arrival: float) -> float:
        """When an answer that arrived at ``arrival`` (loop time) starts: in arrival order, at most one
        per service interval."""
        if not self.service_s:
            return arrival
        start = max(arrival, self.next_start)
        self.next_start = start + self.service_s
        return start

    def answer(self, method: bytes, path: bytes, body: bytes) -> bytes | list[bytes]:
        path = path.split(b"?", 1)[0]
        if method == b"POST" and path == b"/v1/completions":
            self.requests += 1
            try:
                req = json.loads(body or b"{}")
                key = (int(req.get("max_tokens") or 16), bool((req.get("stream_options") or {}).get("include_usage")),
                       bool(req.get("stream")))
            except (ValueError, TypeError, AttributeError):
                return json_answer({"error": {"message": "bad request", "code": 400}}, b"400 Bad Request")
            ans = self.cache.get(key)
            if ans is None:
                tokens, usage, stream = key
                if stream:
                    ans = sse_parts(tokens, usage) if self.paced else sse_answer(tokens, usage)
                else:
                    ans = json_answer({"id": "cmpl-stub", "object": "text_completion", "model": "stub",
                                       "choices": [{"index": 0, "text": " w" * tokens, "finish_reason": "length"}],
                                       "usage": {"prompt_tokens": 0, "completion_tokens": tokens,
                                                 "total_tokens": tokens}})
                self.cache[key] = ans
            return ans
        if path == b"/stats":
            return json_answer(self.summary())
        fixed = self.fixed.get(path)
        if fixed is not None and method == b"GET":
            if path == b"/":
                self.requests += 1
            return fixed
        return json_answer({"error": {"message": "no such path", "code": 404}}, b"404 Not Found")


class Conn(asyncio.Protocol):
    def __init__(self, stub: Stub):
        self.stub = stub
        self.buf = b""
        self.transport = None
        self.paced: asyncio.Task | None = None   # an answer being written token by token
        self.queue: list = []                     # (answer, its start) waiting behind it (pipelined requests)

    def _send(self, answers: list) -> None:
        if self.paced is None and all(isinstance(a, bytes) for a in answers):
            self.transport.write(b"".join(answers))
            return
        now = asyncio.get_running_loop().time()
        self.queue += [(a, self.stub.start_at(now) if isinstance(a, list) else now) for a in answers]
        if self.paced is None:
            self.paced = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Write the queued answers in order; a list answer piece by piece on its schedule: the first
        ``ttft_s`` after its start, the next ones ``token_gap_s`` apart, as a server streams tokens
        while it makes them."""
        loop = asyncio.get_running_loop()
        stub = self.stub
        try:
            while self.queue and not self.transport.is_closing():
                a, start = self.queue.pop(0)
                if isinstance(a, bytes):
                    self.transport.write(a)
                    continue
                for i, piece in enumerate(a):
                    delay = start + stub.ttft_s + i * stub.token_gap_s - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if self.transport.is_closing():
                        return
                    self.transport.write(piece)
                stub.answered += 1
        finally:
            self.paced = None

    def connection_made(self, transport):
        self.transport = transport
        self.stub.connections += 1

    def data_received(self, data: bytes):
        buf = self.buf + data
        out = []
        close = False
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            length = 0
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = lower.find(b"\r\n", at + 2)
                length = int(head[at + 17: stop if stop >= 0 else len(head)].strip() or 0)
            if len(buf) < end + 4 + length:
                break
            line = head.split(b"\r\n", 1)[0].split(b" ")
            body = buf[end + 4: end + 4 + length]
            buf = buf[end + 4 + length:]
            out.append(self.stub.answer(line[0], line[1] if len(line) > 1 else b"/", body))
            if b"\r\nconnection: close" in lower:
                close = True
                break
        self.buf = buf
        if out:
            self._send(out)
        if close and self.paced is None:
            self.transport.close()


def build_parser():
    p = common.parser("loadstub.py", "A fast stand-in OpenAI-compatible endpoint for measuring load clients "
                                     "(streams max_tokens SSE events, computes nothing). One JSON object on exit.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: a free one, see --port-file)")
    p.add_argument("--port-file", default="", help="write the bound port here once listening")
    p.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (default 0: on SIGTERM)")
    p.add_argument("--token-gap-ms", type=float, default=0.0,
                   help="write a streamed answer token by token, this far apart (default 0: in one write)")
    p.add_argument("--ttft-ms", type=float, default=0.0,
                   help="write a streamed answer's first token this long after it starts (default 0)")
    p.add_argument("--service-rps", type=float, default=0.0,
                   help="start answers in arrival order, at most this many per second: a queue with a fixed "
                        "service rate (default 0: every answer starts on arrival)")
    return p


async def serve(args) -> dict:
    stub = Stub(args.token_gap_ms / 1e3, args.ttft_ms / 1e3, args.service_rps)
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(lambda: Conn(stub), args.host, args.port, backlog=1024)
    except OSError as exc:
        raise SystemExit(common.fail_usage(f"cannot listen on {args.host}:{args.port}: port {args.port} is "
                                           f"already in use" if exc.errno == 98 else f"cannot listen: {exc}")) from exc
    port = server.sockets[0].getsockname()[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    common.log(f"loadstub: listening on {args.host}:{port}")
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.duration > 0:
        loop.call_later(args.duration, stop.set)
    await stop.wait()
    server.close()
    return {"port": port, **stub.summary()}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = common.base_result("loadstub")
    result.update(asyncio.run(serve(args)), ok=True)
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
