"""A decoder-only transformer in plain torch, with a KV cache and continuous batching.

Random, seeded weights (nothing is downloaded): the numbers it produces mean nothing, but
its shapes, FLOPs and memory traffic are those of a GPT-style LLM of the chosen size, so
serving it loads a GPU the way serving a real LLM does.

- :class:`LLM`: embeddings (token + learned position), ``layers`` pre-norm blocks
  (multi-head attention, GELU MLP 4x), a final norm and an LM head. ``prefill`` runs the
  prompts of one or more sequences and writes their keys/values into the cache;
  ``decode`` runs one token of every active sequence at once.
- :class:`Engine`: a scheduler thread doing continuous batching. Each step it admits
  queued requests into free cache slots (prefill, up to ``max_prefill_tokens`` prompt
  tokens per step), then runs one decode step for every running sequence; finished
  sequences leave at once and their slot is reused in the next step. Tokens go to each
  request's own queue as soon as they exist (streaming).

The engine times itself: ``forward_s`` (wall time inside prefill/decode forward passes,
synchronised on CUDA: the model's compute), ``busy_s`` (wall time inside steps: forward
plus the scheduler's own Python), and per request the share of forward time it was part of; per
step (``llm_step.StepClock``) ``cpu_s``, the server's CPU time, against ``device_s``, the device's
time (CUDA events on a GPU). With ``graphs`` (``llm_step.GraphDecoder``) a decode step is one CUDA
graph replay instead of some 15 calls per layer.
It also keeps how full it was: ``running_s`` and ``waiting_s``, the running (batch slots
used) and waiting requests summed over the steps' wall time, so that two readings give the
mean of each between them. A loop that is never idle ("busy 100%") with 2 of 16 slots used
and nobody waiting has room; one with every slot used and a queue has none.

Greedy decoding. Token 0 is end-of-sequence: a request stops on it unless it asked for
``ignore_eos`` (or has not reached ``min_tokens``); with random weights it is rare.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
import time
import zlib

import llm_step

EOS = 0

# name -> (layers, hidden, heads, vocab). Parameters ~ 12 * layers * hidden^2 + 2 * vocab * hidden.
PRESETS = {
    "tiny": (2, 64, 4, 512),          # ~0.1M: protocol tests
    "cpu": (4, 512, 8, 2048),         # ~15M: the CPU path (CI); compute-bound on one core
    "small": (12, 768, 12, 32000),    # ~134M (GPT-2 small shape)
    "1b": (16, 2048, 16, 32000),      # ~0.9B
    "7b": (32, 4096, 32, 32000),      # ~6.7B (Llama-2-7B-like shape, GELU MLP)
}


def param_count(layers: int, hidden: int, vocab: int, max_seq: int) -> int:
    return layers * (12 * hidden * hidden + 13 * hidden) + 2 * vocab * hidden + max_seq * hidden + 2 * hidden


def auto_preset(device: str) -> str:
    """The preset the device's memory fits: the CPU gets 'cpu'; a GPU the largest whose
    weights take at most about a quarter of its memory (the rest is KV cache)."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    for name in ("7b", "1b", "small"):
        layers, hidden, _, vocab = PRESETS[name]
        if param_count(layers, hidden, vocab, 4096) * 2 <= total / 4:
            return name
    return "tiny"


def tokenize(text: str, vocab: int) -> list[int]:
    """One token per whitespace-separated word (ids 1..vocab-1; 0 is EOS). Deterministic."""
    return [zlib.crc32(w.encode()) % (vocab - 1) + 1 for w in text.split()]


def detokenize(token: int) -> str:
    return f" w{token}"


class LLM:
    """The model and its KV cache (``slots`` sequences of up to ``max_seq`` tokens)."""

    def __init__(self, layers: int, hidden: int, heads: int, vocab: int, max_seq: int, slots: int,
                 device: str = "cpu", dtype=None, seed: int = 0):
        import torch

        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
        self.layers, self.hidden, self.heads, self.vocab = layers, hidden, heads, vocab
        self.head_dim = hidden // heads
        self.max_seq, self.slots, self.device = max_seq, slots, device
        self.dtype = dtype or (torch.bfloat16 if device.startswith("cuda") else torch.float32)
        gen = torch.Generator(device=device).manual_seed(seed)

        def rand(*shape, std=0.02):
            return torch.randn(*shape, generator=gen, device=device, dtype=self.dtype) * std

        def ones(n):
            return torch.ones(n, device=device, dtype=self.dtype)

        out_std = 0.02 / math.sqrt(2 * layers)
        self.embed = rand(vocab, hidden)
        self.pos = rand(max_seq, hidden)
        self.blocks = [{
            "ln1": ones(hidden), "wqkv": rand(hidden, 3 * hidden), "wo": rand(hidden, hidden, std=out_std),
            "ln2": ones(hidden), "w1": rand(hidden, 4 * hidden), "w2": rand(4 * hidden, hidden, std=out_std),
        } for _ in range(layers)]
        self.lnf = ones(hidden)
        self.head = rand(hidden, vocab)
        cache_shape = (layers, slots, heads, max_seq, self.head_dim)
        self.k = torch.zeros(cache_shape, device=device, dtype=self.dtype)
        self.v = torch.zeros(cache_shape, device=device, dtype=self.dtype)
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)   # per-layer views, indexed once

    @property
    def n_params(self) -> int:
        return param_count(self.layers, self.hidden, self.vocab, self.max_seq)

    @staticmethod
    def kv_bytes_per_token(layers: int, hidden: int, dtype_bytes: int) -> int:
        return 2 * layers * hidden * dtype_bytes

    def _norm(self, x, w):
        import torch.nn.functional as F

        return F.layer_norm(x, (self.hidden,), w)

    def _mlp(self, x, b):
        import torch.nn.functional as F

        return F.gelu(self._norm(x, b["ln2"]) @ b["w1"], approximate="tanh") @ b["w2"]

    def _logits(self, x):
        return (self._norm(x, self.lnf) @ self.head).float()

    def prefill(self, prompts: list[list[int]], slot0: int) -> list[int]:
        """Prompts of equal length into slots slot0.. slot0+n-1; returns the first token of each."""
        return self.prefill_async(prompts, slot0).tolist()

    def prefill_async(self, prompts: list[list[int]], slot0: int):
        """:meth:`prefill`, its tokens left on the device (a tensor: reading it waits for the GPU)."""
        import torch
        import torch.nn.functional as F

        n, length = len(prompts), len(prompts[0])
        with torch.inference_mode():
            ids = torch.tensor(prompts, device=self.device)
            x = self.embed[ids] + self.pos[:length]
            for i, b in enumerate(self.blocks):
                q, k, v = (self._norm(x, b["ln1"]) @ b["wqkv"]).view(n, length, 3, self.heads, self.head_dim) \
                    .permute(2, 0, 3, 1, 4)
                self.k[i, slot0:slot0 + n, :, :length] = k
                self.v[i, slot0:slot0 + n, :, :length] = v
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + a.transpose(1, 2).reshape(n, length, self.hidden) @ b["wo"]
                x = x + self._mlp(x, b)
            return self._logits(x[:, -1]).argmax(-1)

    def decode(self, tokens: list[int], lengths: list[int]) -> list[int]:
        """One token for each of the first len(tokens) slots; ``lengths[i]`` tokens are cached
        for slot i (the new token goes to that position). Returns the next token of each."""
        return self.decode_async(tokens, lengths).tolist()

    def decode_async(self, tokens: list[int], lengths: list[int]):
        """:meth:`decode`, its tokens left on the device."""
        import torch

        return self.decode_core(torch.tensor(tokens, device=self.device), torch.tensor(lengths, device=self.device),
                                max(lengths) + 1)

    def decode_core(self, ids, pos, span: int):
        """The decode step on device tensors only (no host sync, fixed shapes for a given batch and ``span``: what
        a CUDA graph captures, see ``llm_step.GraphDecoder``): slot i takes token ``ids[i]`` at position
        ``pos[i]`` and attends to its positions ``0..pos[i]`` of the first ``span``. The batch is 2-D (n, hidden)
        and each residual add is fused into its matmul (``addmm``): fewer calls per layer, the same maths."""
        import torch
        import torch.nn.functional as F

        n = ids.shape[0]
        with torch.inference_mode():
            rows = torch.arange(n, device=self.device)
            x = self.embed[ids] + self.pos[pos]                                      # n, h
            mask = (torch.arange(span, device=self.device)[None, :] <= pos[:, None])[:, None, None, :]
            for b, kc, vc in zip(self.blocks, self.k_layers, self.v_layers):
                q, k, v = (self._norm(x, b["ln1"]) @ b["wqkv"]).view(n, 3, self.heads, self.head_dim) \
                    .unbind(1)                                                       # n, H, D each
                kc[rows, :, pos] = k
                vc[rows, :, pos] = v
                a = F.scaled_dot_product_attention(q.unsqueeze(2), kc[:n, :, :span], vc[:n, :, :span],
                                                   attn_mask=mask)
                x = torch.addmm(x, a.view(n, self.hidden), b["wo"])
                x = torch.addmm(x, F.gelu(self._norm(x, b["ln2"]) @ b["w1"], approximate="tanh"), b["w2"])
            return self._logits(x).argmax(-1)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy a sequence's cache to another slot (keeps running sequences in slots 0..n-1)."""
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]


class Request:
    """One completion: prompt tokens in, generated tokens out through ``out`` (None = done)."""

    __slots__ = ("prompt", "max_tokens", "min_tokens", "ignore_eos", "out", "generated", "last", "finish",
                 "t_submit", "t_admit", "t_first", "t_done", "model_s", "error")

    def __init__(self, prompt: list[int], max_tokens: int, min_tokens: int = 0, ignore_eos: bool = False):
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.generated = 0
        self.last = 0
        self.finish = None           # "length" or "stop"
        self.t_submit = time.perf_counter()
        self.t_admit = self.t_first = self.t_done = None
        self.model_s = 0.0           # this request's share of forward-pass time
        self.error = None

    def _emit(self, token: int) -> bool:
        """Deliver a token; True when the request is finished."""
        self.generated += 1
        self.last = token
        self.out.put(token)
        if self.generated >= self.max_tokens:
            self.finish = "length"
        elif token == EOS and not self.ignore_eos and self.generated >= self.min_tokens:
            self.finish = "stop"
        return self.finish is not None


class Engine:
    """Continuous batching over an :class:`LLM` in one scheduler thread."""

    def __init__(self, model: LLM, max_prefill_tokens: int = 8192, max_queue: int = 4096, graphs=None):
        self.model = model
        self.graphs = graphs                  # an llm_step.GraphDecoder: decode steps as graph replays
        self.graphs_error: str | None = None  # why the graphs were given up (then decode runs eagerly)
        self.clock = llm_step.StepClock(model.device)
        self.max_prefill_tokens = max_prefill_tokens
        self.max_queue = max_queue
        self.waiting: list[Request] = []
        self.running: list[Request] = []      # running[i] lives in cache slot i
        self.cond = threading.Condition()
        self.stopping = False
        self.lock = threading.Lock()          # guards the counters below
        self.counters = {"steps": 0, "prefill_steps": 0, "decode_steps": 0, "forward_s": 0.0, "busy_s": 0.0,
                         "prefill_tokens": 0, "decode_tokens": 0, "finished": 0, "batch_rows": 0,
                         "max_batch_seen": 0, "running_s": 0.0, "waiting_s": 0.0,
                         # per step (llm_step.StepClock): the server's CPU and the device's time, summed
                         "cpu_s": 0.0, "device_s": 0.0, "graph_steps": 0}
        self.thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> "Engine":
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=30)

    def submit(self, req: Request) -> None:
        """Queue a request (queue.Full when ``max_queue`` are already waiting)."""
        with self.cond:
            if len(self.waiting) >= self.max_queue:
                raise queue.Full
            self.waiting.append(req)
            self.cond.notify()

    def depth(self) -> tuple[int, int]:
        with self.cond:
            return len(self.waiting), len(self.running)

    def snapshot(self) -> dict:
        with self.lock:
            out = dict(self.counters)
        out["device_timer"] = self.clock.timer
        out["cuda_graphs"] = ("off" if self.graphs is None else
                              f"failed: {self.graphs_error}" if self.graphs_error else "on")
        return out

    # -- the scheduler thread
    def _decode(self, tokens: list[int], lengths: list[int]):
        """The decode step's tokens (a device tensor): a graph replay, or eager when there are no graphs or
        they failed (once: the reason is kept and the rest of the run is eager)."""
        if self.graphs is not None and self.graphs_error is None:
            try:
                out = self.graphs.decode(tokens, lengths)
                with self.lock:
                    self.counters["graph_steps"] += 1
                return out
            except Exception as exc:  # a capture or replay that fails must not take the server down
                self.graphs_error = f"{type(exc).__name__}: {exc}"
                print(f"CUDA graphs given up, decoding eagerly: {self.graphs_error}", file=sys.stderr, flush=True)
        return self.model.decode_async(tokens, lengths)

    def _admit(self) -> list[Request]:
        with self.cond:
            while not self.waiting and not self.running and not self.stopping:
                self.cond.wait(timeout=0.5)
            admitted, budget = [], self.max_prefill_tokens
            free = self.model.slots - len(self.running)
            while self.waiting and len(admitted) < free:
                n = len(self.waiting[0].prompt)
                if admitted and n > budget:
                    break
                admitted.append(self.waiting.pop(0))
                budget -= n
            return admitted

    def _finish(self, req: Request, now: float) -> None:
        req.t_done = now
        req.out.put(None)

    def _run(self) -> None:
        clock = self.clock
        while not self.stopping:
            admitted = self._admit()
            if self.stopping:
                break
            t_step = time.perf_counter()
            clock.begin()
            fwd = 0.0
            running = len(self.running) + len(admitted)
            try:
                # prefill the admitted prompts, equal lengths together
                by_len: dict[int, list[Request]] = {}
                for r in admitted:
                    r.t_admit = t_step
                    by_len.setdefault(len(r.prompt), []).append(r)
                for length, group in by_len.items():
                    slot0 = len(self.running)
                    t0 = time.perf_counter()
                    with clock.forward():
                        out = self.model.prefill_async([r.prompt for r in group], slot0)
                    with clock.wait():
                        firsts = out.tolist()
                    dt = time.perf_counter() - t0
                    fwd += dt
                    now = time.perf_counter()
                    for r, tok in zip(group, firsts):
                        r.model_s += dt / len(group)
                        r.t_first = now
                        self.running.append(r)
                        r._emit(tok)
                    with self.lock:
                        self.counters["prefill_steps"] += 1
                        self.counters["prefill_tokens"] += length * len(group)
                self._retire()
                # one decode step for every running sequence
                if self.running:
                    batch = list(self.running)
                    t0 = time.perf_counter()
                    with clock.forward():
                        out = self._decode([r.last for r in batch], [len(r.prompt) + r.generated - 1 for r in batch])
                    with clock.wait():
                        nxt = out.tolist()
                    dt = time.perf_counter() - t0
                    fwd += dt
                    share = dt / len(batch)
                    for r, tok in zip(batch, nxt):
                        r.model_s += share
                        r._emit(tok)
                    with self.lock:
                        self.counters["decode_steps"] += 1
                        self.counters["decode_tokens"] += len(batch)
                        self.counters["batch_rows"] += len(batch)
                        self.counters["max_batch_seen"] = max(self.counters["max_batch_seen"], len(batch))
                    self._retire()
            except Exception as exc:  # fail every request in flight, keep serving
                for r in admitted + self.running:
                    if r.t_done is None:
                        r.error = f"{type(exc).__name__}: {exc}"
                        self._finish(r, time.perf_counter())
                with self.cond:
                    self.running = []
            busy = time.perf_counter() - t_step
            cpu_s, device_s = clock.end()
            with self.lock:
                self.counters["cpu_s"] += cpu_s
                self.counters["device_s"] += device_s
                self.counters["steps"] += 1
                self.counters["forward_s"] += fwd
                self.counters["busy_s"] += busy
                self.counters["running_s"] += running * busy
                self.counters["waiting_s"] += len(self.waiting) * busy
        for r in self.running + self.waiting:
            r.error = "server stopping"
            self._finish(r, time.perf_counter())

    def _retire(self) -> None:
        """Drop finished sequences; move the last running ones into the freed slots."""
        now = time.perf_counter()
        keep = []
        for r in self.running:
            if r.finish is not None:
                self._finish(r, now)
                with self.lock:
                    self.counters["finished"] += 1
            else:
                keep.append(r)
        if len(keep) == len(self.running):
            return
        # compact: sequence j of keep must live in slot j
        old_slot = {id(r): i for i, r in enumerate(self.running)}
        for j, r in enumerate(keep):
            i = old_slot[id(r)]
            if i != j:
                self.model.move_slot(i, j, len(r.prompt) + r.generated)
        with self.cond:
            self.running = keep
