"""The collectives of allreduce.py's sweep: nccl-tests' sizes and bandwidths, the torch calls, the #wrong check.

allreduce.py times all_reduce, all_gather, reduce_scatter, alltoall and sendrecv (the collectives that
nccl-tests ships and that training jobs run: data-parallel gradients, sharded weights and optimiser
state, expert parallelism, pipeline stages). This module holds what each one is, apart from the sweep
and the launch: the definitions have to be exactly nccl-tests' (src/<name>.cu at NVIDIA/nccl-tests
a0b82b2) so that a figure read here compares with one read from ``*_perf``, and they are tested on their
own, without processes.

Sizes (nccl-tests' ``getCollByteCount``, its ``setupArgs`` and the size column it prints): for a swept
size S and an element of ``e`` bytes, count = S / e and

- all_reduce, sendrecv: every rank's buffer holds ``count`` elements; size = count x e;
- all_gather, reduce_scatter, alltoall: every rank's share is base = count / n rounded down to a
  multiple of 16 bytes' worth of elements; size = base x e x n, the whole (gathered, scattered or
  exchanged) buffer; the printed count is ``base``. A size whose share is 0 is left out.

Bandwidth: algbw = size / t, busbw = algbw x factor(n): 2(n-1)/n for all_reduce, (n-1)/n for
all_gather, reduce_scatter and alltoall, 1 for sendrecv (every rank sends to rank+1 and receives
from rank-1 at once).

#wrong: known patterns that every rank can compute for every element (:func:`input_pattern`,
:func:`expected_pattern`), filled and checked in chunks of ``CHECK_CHUNK`` elements so that a 1 GiB
buffer does not need another GiB:

- the reductions (all_reduce, reduce_scatter) put (g + rank) mod 3 at input index g, so that an
  output element is the sum of those over the ranks (:func:`expected_sum_table`), with the dtype's
  rounding as tolerance for float16 / bfloat16 (the sums grow with the ranks);
- the moves (all_gather, alltoall, sendrecv) carry ``moved_value(src, k, dst)`` = (k + 17 src + 29 dst)
  mod 127 at element k of the chunk ``src`` sends to ``dst`` (dst 0 for all_gather, whose chunk goes
  to every rank): integers below 127, exact in every dtype, so a chunk from or for another rank, or
  one shifted (by other than a multiple of 127 elements), is counted.

Which torch call runs each (:data:`CALLS`, first that the backend has): all_reduce; all_gather_into_tensor,
else all_gather into views of one tensor (the same traffic); reduce_scatter_tensor, else reduce_scatter from
views; all_to_all_single, else all_to_all over views; sendrecv as batch_isend_irecv of one isend to rank+1 and
one irecv from rank-1 (NCCL groups them like nccl-tests' ncclGroupStart/End). A collective none of whose calls
the backend has is not measured, with why; nothing stands in for it, since e.g. an all-reduce then a slice is
another traffic than a reduce-scatter. Nor is a call that the backend itself runs as another collective
(:data:`STAND_INS`): gloo's reduce-scatter, missing in older torch, is in torch 2.15 one all-reduce of the
whole input and a copy of the share (seen with torch.profiler: a single gloo:all_reduce); gloo's all-gather,
all-to-all and send / recv are its own (gloo:all_gather, gloo:all_to_all, gloo:send and gloo:recv).
"""

from __future__ import annotations

import os

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")

# nccl-tests bus bandwidth factors (src/*.cu, "getBw"): busbw = algbw * factor(n)
BUSBW_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "sendrecv": lambda n: 1.0,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}

SHARED = ("all_gather", "reduce_scatter", "alltoall")   # size = every rank's share x n
REDUCING = ("all_reduce", "reduce_scatter")             # sums: the mod-3 pattern, dtype tolerance
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum"}  # the others print "none"
ALIGN_BYTES = 16                                        # nccl-tests: a rank's share is a multiple of 16 bytes
MOVED_MOD, MOVED_SRC, MOVED_DST = 127, 17, 29           # moved_value's pattern
CHECK_CHUNK = 1 << 24  # elements per step of the #wrong check: bounded extra memory for 1 GiB buffers
TOLERANCE = {"float16": 2.0**-10, "bfloat16": 2.0**-7}  # relative, for the sums only

CORRUPT_RANK_ENV = "GPUPROOF_TEST_CORRUPT_RANK"         # test-only: this rank spoils one output element
CORRUPT_COLLECTIVE_ENV = "GPUPROOF_TEST_CORRUPT_COLLECTIVE"   # ... of this collective only (default: all)

# the torch.distributed calls, in order of preference; the fallbacks move the same bytes between the same ranks
CALLS = {
    "all_reduce": ("all_reduce",),
    "all_gather": ("all_gather_into_tensor", "all_gather"),
    "reduce_scatter": ("reduce_scatter_tensor", "reduce_scatter"),
    "alltoall": ("all_to_all_single", "all_to_all"),
    "sendrecv": ("batch_isend_irecv",),
}
ONE_RANK_SENDRECV = "1 rank: sendrecv has no other rank to send to (torch.distributed does not send to itself)"
# calls a backend has, but as another collective's traffic: measuring them would put a wrong figure under the name
STAND_INS = {
    ("gloo", "reduce_scatter"): (
        "runs as an all-reduce of the whole input and a copy of this rank's share (ProcessGroupGloo, torch 2.15: "
        "one gloo:all_reduce): all-reduce traffic, 2(n-1)/n x S per rank against a reduce-scatter's (n-1)/n x S, "
        "so its busbw would not be a reduce-scatter's"),
}


def algbw_gbps(size_bytes: float, seconds: float) -> float:
    """nccl-tests algorithm bandwidth: bytes / seconds, in GB/s (1e9)."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    return size_bytes / seconds / 1e9


def busbw_gbps(size_bytes: float, seconds: float, nranks: int, collective: str = "all_reduce") -> float:
    """nccl-tests bus bandwidth: algbw times the collective's factor for ``nranks``."""
    if nranks < 1:
        raise ValueError("nranks must be >= 1")
    return algbw_gbps(size_bytes, seconds) * BUSBW_FACTORS[collective](nranks)


def coll_counts(collective: str, size: int, elem: int, nranks: int) -> tuple[int, int]:
    """(count, size_bytes) that nccl-tests prints for a swept ``size``: count is every rank's share for
    all_gather / reduce_scatter / alltoall (rounded down to 16 bytes' worth), the buffer's for the others;
    size_bytes the whole buffer (share x n for those three). (0, 0) when nothing is left."""
    count = size // elem
    if collective in SHARED:
        count = (count // nranks) & ~(max(1, ALIGN_BYTES // elem) - 1)
        return count, count * elem * nranks
    if collective not in BUSBW_FACTORS:
        raise ValueError(f"unknown collective {collective!r}")
    return count, count * elem


def buffer_counts(collective: str, count: int, nranks: int) -> tuple[int, int]:
    """Elements of one rank's (input, output) buffer for the ``count`` of :func:`coll_counts`."""
    return {"all_gather": (count, count * nranks), "reduce_scatter": (count * nranks, count),
            "alltoall": (count * nranks, count * nranks)}.get(collective, (count, count))


def expected_sum_table(nranks: int) -> list[int]:
    """sum over ranks r < n of (b + r) mod 3, for b = 0, 1, 2 (the #wrong check's pattern)."""
    return [sum((b + r) % 3 for r in range(nranks)) for b in range(3)]


def moved_value(src, k, dst):
    """Element k of the chunk rank ``src`` sends to rank ``dst`` (ints or int64 tensors alike)."""
    return (k + MOVED_SRC * src + MOVED_DST * dst) % MOVED_MOD


def input_pattern(collective: str, rank: int, nranks: int, count: int, g):
    """What rank ``rank`` puts at index ``g`` (an int or an int64 tensor) of its input buffer."""
    if collective in REDUCING:
        return (g + rank) % 3
    if collective == "all_gather":
        return moved_value(rank, g, 0)
    if collective == "alltoall":  # chunk j goes to rank j
        return moved_value(rank, g % count, g // count)
    if collective == "sendrecv":
        return moved_value(rank, g, (rank + 1) % nranks)
    raise ValueError(f"unknown collective {collective!r}")


def expected_pattern(collective: str, rank: int, nranks: int, count: int, g):
    """What rank ``rank`` must find at index ``g`` (an int or an int64 tensor) of its output buffer."""
    if collective in REDUCING:
        at = g if collective == "all_reduce" else rank * count + g  # reduce_scatter: this rank's share
        table = expected_sum_table(nranks)
        if isinstance(at, int):
            return table[at % 3]
        import torch

        return torch.tensor(table, dtype=torch.int64, device=at.device)[at % 3]
    if collective == "all_gather":  # chunk s came from rank s
        return moved_value(g // count, g % count, 0)
    if collective == "alltoall":  # chunk s came from rank s, meant for this rank
        return moved_value(g // count, g % count, rank)
    if collective == "sendrecv":
        return moved_value((rank - 1) % nranks, g, rank)
    raise ValueError(f"unknown collective {collective!r}")


# --------------------------------------------------------------------------- torch


def make_call(collective: str, api: str, inp, out, rank: int, world: int, group=None):
    """A function that runs ``collective`` once, from ``inp`` into ``out`` (the same tensor for all_reduce)."""
    import torch.distributed as dist

    if api == "all_reduce":
        return lambda: dist.all_reduce(out, group=group)
    if api == "all_gather_into_tensor":
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if api == "all_gather":
        outs = list(out.chunk(world))
        return lambda: dist.all_gather(outs, inp, group=group)
    if api == "reduce_scatter_tensor":
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)
    if api == "reduce_scatter":
        ins = list(inp.chunk(world))
        return lambda: dist.reduce_scatter(out, ins, group=group)
    if api == "all_to_all_single":
        return lambda: dist.all_to_all_single(out, inp, group=group)
    if api == "all_to_all":
        outs, ins = list(out.chunk(world)), list(inp.chunk(world))
        return lambda: dist.all_to_all(outs, ins, group=group)
    if api == "batch_isend_irecv":
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
        me = ranks.index(rank)
        nxt, prv = ranks[(me + 1) % len(ranks)], ranks[(me - 1) % len(ranks)]

        def sendrecv():
            ops = [dist.P2POp(dist.isend, inp, nxt, group), dist.P2POp(dist.irecv, out, prv, group)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return sendrecv
    raise ValueError(f"unknown torch call {api!r}")


def buffers(collective: str, count: int, world: int, dtype: str, device: str):
    """(input, output) tensors of one rank, random data; all_reduce is in place (one tensor)."""
    import torch

    n_in, n_out = buffer_counts(collective, count, world)

    def rand(n):
        return torch.randn(n, device=device, dtype=torch.float32).to(getattr(torch, dtype))

    if collective == "all_reduce":
        buf = rand(n_in)
        return buf, buf
    return rand(n_in), torch.zeros(n_out, device=device, dtype=getattr(torch, dtype))


def _unsupported(exc: BaseException) -> bool:
    """An error that says the backend lacks the call (not one from a failing network or device)."""
    text = str(exc).lower()
    return isinstance(exc, (NotImplementedError, AttributeError)) or any(
        w in text for w in ("not support", "not implemented", "unsupported", "does not have"))


def choose_call(collective: str, world: int, rank: int, backend: str, device: str) -> tuple[str | None, str | None]:
    """(torch call, None) for the first call of ``CALLS[collective]`` that runs on this backend, or (None, why
    not). Every rank calls this; the ranks agree on the answer (an all-reduce of which calls ran)."""
    import torch
    import torch.distributed as dist

    if collective == "sendrecv" and world == 1:
        return None, ONE_RANK_SENDRECV
    errors, ran = {}, [0] * len(CALLS[collective])
    for i, api in enumerate(CALLS[collective]):
        inp, out = buffers(collective, ALIGN_BYTES // 4, world, "float32", device)
        try:
            make_call(collective, api, inp, out, rank, world)()
        except Exception as exc:  # noqa: BLE001 - sorted here: a missing call, or a real failure (raised)
            if not _unsupported(exc):
                raise
            lines = str(exc).strip().splitlines()
            errors[api] = f"{type(exc).__name__}: {lines[0] if lines else ''}"
            continue
        ran[i] = 1
        break
    ran = torch.tensor(ran, dtype=torch.int64, device=device)
    dist.all_reduce(ran, op=dist.ReduceOp.MIN)
    for api, ok in zip(CALLS[collective], ran.tolist()):
        if ok and (backend, collective) in STAND_INS:
            return None, (f"not supported by backend {backend} as a {collective} in torch {torch.__version__}: "
                          f"its {api} {STAND_INS[backend, collective]}")
        if ok:
            return api, None
    said = "; ".join(f"{api}: {why}" for api, why in errors.items()) or "it failed on another rank"
    return None, f"not supported by backend {backend} in torch {torch.__version__} ({said})"


def _corrupt(collective: str, rank: int) -> bool:
    """Test-only: does this rank spoil its output before the #wrong check?"""
    who = os.environ.get(CORRUPT_RANK_ENV)
    which = os.environ.get(CORRUPT_COLLECTIVE_ENV)
    return who not in (None, "") and int(who) == rank and which in (None, "", collective)


def count_wrong(collective: str, api: str, inp, out, count: int, rank: int, world: int, dtype: str,
                device: str) -> int:
    """Fill the input with the known pattern, run the collective once, count output elements off the expected
    values, summed over the ranks (all ranks call this)."""
    import torch
    import torch.distributed as dist

    n_in, n_out = buffer_counts(collective, count, world)
    for lo in range(0, n_in, CHECK_CHUNK):
        hi = min(n_in, lo + CHECK_CHUNK)
        inp[lo:hi].copy_(input_pattern(collective, rank, world, count, torch.arange(lo, hi, device=device)))
    make_call(collective, api, inp, out, rank, world)()
    if n_out and _corrupt(collective, rank):
        out[0] += 1
    tol = TOLERANCE.get(dtype, 0.0) if collective in REDUCING else 0.0
    wrong = 0
    for lo in range(0, n_out, CHECK_CHUNK):
        hi = min(n_out, lo + CHECK_CHUNK)
        want = expected_pattern(collective, rank, world, count, torch.arange(lo, hi, device=device)).double()
        diff = (out[lo:hi].double() - want).abs()
        wrong += int((diff > tol * want.abs().clamp(min=1.0)).sum())
    t = torch.tensor([wrong], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return int(t.item())
