"""The inference engine's step, measured and made cheap: :class:`StepClock` times every engine step (the
server's CPU against the device's time), :class:`GraphDecoder` runs the decode step as one CUDA graph replay.

**What a step costs** (``llm_model.Engine`` uses one clock per step, a step being the prefills of the admitted
prompts plus one decode of the running batch):

- ``cpu_s``: the engine thread's CPU time over the step (``time.thread_time``), less its CPU time inside the
  waits for the device (the blocking reads of the step's tokens: on CUDA the thread may spin there, and that is
  the GPU's time, not the server's) and, on the CPU, less the forward calls themselves (there the compute *is*
  the device's work). On a GPU it is everything the server's Python spends to issue and handle a step: the
  scheduler, the model's per-layer dispatch and kernel launches; on the CPU only the scheduler.
- ``device_s``: on CUDA, ``torch.cuda.Event`` pairs recorded around each forward call on the stream and read
  once the step's own read of its tokens has synchronised the stream (no extra sync: an event still pending
  is read at a later step's end); on the CPU, the wall time of the forward calls.

Their ratio per step (``cpu_per_device_step``) is the point: on a GPU the device waits for Python when the
ratio is near or above 1 (CUDA events count the gaps between kernels that the launches leave, so a launch-bound
step reads device time about equal to its CPU time), and it is the GPU that bounds the step when the ratio is
well below 1. On the CPU it is the scheduler's share against the model's compute, a few per cent.

**The decode step as one graph**: eager decode of a 32-layer model is some 500 kernel launches, each a few
microseconds of Python and driver; captured once as a CUDA graph, the step is one ``replay()``. Shapes are
static in a graph, so batch and attention span are rounded up to buckets (:func:`buckets`): the padded rows
write into free cache slots (the running sequences live in slots 0..n-1, the rest are free) at position 0 and
their tokens are dropped; the longer span is masked. One graph per (batch bucket, span bucket), captured at
start (:meth:`GraphDecoder.capture_all`) into one shared memory pool: graphs never run concurrently, and each
replay's output is read before the next replay. ``backend`` is the capture mechanism: :class:`CudaGraphs`, or
in tests a stand-in that "captures" a function by keeping it and "replays" it by calling it on the same static
buffers, which exercises the bucketing and padding on the CPU.
"""

from __future__ import annotations

import contextlib
import time


class StepClock:
    """One engine step's CPU and device time (see the module's doc); ``begin()``, then ``forward()`` around each
    forward call's launch and ``wait()`` around each blocking read of its result, then ``end()``."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.timer = "cuda-events" if self.cuda else "wall"
        self._pending: list = []     # CUDA event pairs not read yet
        self._spare: list = []       # event pairs to reuse
        self._cpu0 = self._excluded = self._device = 0.0

    def begin(self) -> None:
        self._cpu0 = time.thread_time()
        self._excluded = self._device = 0.0

    @contextlib.contextmanager
    def forward(self):
        """Around a forward call (its launch, on CUDA: the call returns before the GPU is done)."""
        if self.cuda:
            import torch

            pair = self._spare.pop() if self._spare else (torch.cuda.Event(enable_timing=True),
                                                          torch.cuda.Event(enable_timing=True))
            pair[0].record()
            try:
                yield
            finally:
                pair[1].record()
                self._pending.append(pair)
            return
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            self._device += time.perf_counter() - t0
            self._excluded += time.thread_time() - c0

    @contextlib.contextmanager
    def wait(self):
        """Around a blocking read of a forward call's result: the thread's CPU there is not the server's."""
        c0 = time.thread_time()
        try:
            yield
        finally:
            self._excluded += time.thread_time() - c0

    def end(self) -> tuple[float, float]:
        """(cpu_s, device_s) of the step. On CUDA the device time is that of the event pairs complete by now
        (all of this step's, once its tokens were read; a pair still pending counts at a later step)."""
        cpu = max(0.0, time.thread_time() - self._cpu0 - self._excluded)
        device = self._device
        if self.cuda:
            left = []
            for start, stop in self._pending:
                if stop.query():
                    device += start.elapsed_time(stop) / 1e3
                    self._spare.append((start, stop))
                else:
                    left.append((start, stop))
            self._pending = left
        return cpu, device


def buckets(top: int, first: int = 1) -> list[int]:
    """``first``, doubling, up to ``top`` (always included): the static sizes graphs are captured for."""
    out, b = [], max(1, first)
    while b < top:
        out.append(b)
        b *= 2
    return out + [top]


def bucket(sizes: list[int], n: int) -> int:
    """The smallest size in ``sizes`` that holds ``n``."""
    for s in sizes:
        if s >= n:
            return s
    raise ValueError(f"{n} is over the largest bucket {sizes[-1]}")


class CudaGraphs:
    """Captures a function as a CUDA graph (after two warm-up runs on a side stream, as torch's docs do), every
    graph into one memory pool. ``capture(fn)`` returns (replay, fn's output: the graph's static output)."""

    name = "cuda"

    def __init__(self):
        self.pool = None

    def capture(self, fn):
        import torch

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the server's other threads (HTTP handlers, the NVML sampler) never touch CUDA, but a
        # global capture would fail on any CUDA call they made
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = fn()
        self.pool = graph.pool()
        return graph.replay, out


class GraphDecoder:
    """``llm_model.LLM``'s decode step through captured graphs: ``decode(tokens, lengths)`` returns the next
    tokens as a device tensor, as ``LLM.decode_async`` does."""

    def __init__(self, model, backend=None, min_span: int = 64):
        import torch

        self.model = model
        self.backend = backend or CudaGraphs()
        self.batch_sizes = buckets(model.slots)
        self.spans = buckets(model.max_seq, min(min_span, model.max_seq))
        # tokens (row 0) and positions (row 1) of the batch: every graph reads its first B columns
        self.inputs = torch.zeros(2, model.slots, dtype=torch.long, device=model.device)
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.replays = 0

    def _capture(self, size: int, span: int):
        ids, pos = self.inputs[0, :size], self.inputs[1, :size]
        self.graphs[size, span] = self.backend.capture(lambda: self.model.decode_core(ids, pos, span))
        return self.graphs[size, span]

    def capture_all(self) -> int:
        """Every (batch, span) graph now, largest first (the pool's first allocations are its largest); the
        inputs are zeros: token 0 at position 0 of every slot, overwritten by the first prefill."""
        self.inputs.zero_()
        for size in reversed(self.batch_sizes):
            for span in reversed(self.spans):
                if (size, span) not in self.graphs:
                    self._capture(size, span)
        return len(self.graphs)

    def decode(self, tokens: list[int], lengths: list[int]):
        import torch

        n = len(tokens)
        size, span = bucket(self.batch_sizes, n), bucket(self.spans, max(lengths) + 1)
        pad = [0] * (size - n)
        self.inputs[:, :size].copy_(torch.tensor([tokens + pad, lengths + pad]))
        replay, out = self.graphs.get((size, span)) or self._capture(size, span)
        replay()
        self.replays += 1
        return out[:n]
