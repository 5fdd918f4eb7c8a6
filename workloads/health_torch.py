"""health.py's CUDA side: the matmul burst under which throttling and PCIe are read, host<->device copies and
the GPU-to-GPU copy matrix (CPU tensors where CUDA is missing)."""

from __future__ import annotations

import time

import workload_common as common

# --------------------------------------------------------------------------- torch: load and copies


def pick_dtype(torch, device: str):
    if not device.startswith("cuda"):
        return torch.float32
    cc = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if cc >= (8, 0) else torch.float16 if cc >= (7, 0) else torch.float32


def matmul_burst(devices: list[str], seconds: float, size: int) -> dict:
    """Keep every device busy with matmuls for ``seconds`` (bounded by time, synchronized per round)."""
    import torch

    ops = []
    for d in devices:
        dt = pick_dtype(torch, d)
        a = torch.randn(size, size, device=d, dtype=torch.float32).to(dt)
        b = torch.randn(size, size, device=d, dtype=torch.float32).to(dt)
        ops.append((d, a, b, torch.empty(size, size, device=d, dtype=dt)))
    rounds, per_round = 0, 8 if devices and devices[0].startswith("cuda") else 1
    t0 = time.monotonic()
    deadline = t0 + seconds
    while True:
        for _dev, a, b, c in ops:
            for _ in range(per_round):
                torch.matmul(a, b, out=c)
        for d, *_ in ops:
            common.sync(d)
        rounds += 1
        if time.monotonic() >= deadline:
            break
    elapsed = time.monotonic() - t0
    return {"devices": devices, "size": size, "dtype": [str(o[1].dtype).removeprefix("torch.") for o in ops],
            "matmuls": rounds * per_round * len(ops), "seconds": round(elapsed, 3)}


def copy_bandwidth(device: str, nbytes: int, iters: int) -> dict:
    """Median host-to-device and device-to-host copy bandwidth (GB/s, 1e9 B/s), pinned host memory.

    On the CPU the same code copies between two host tensors (the code path, not a bus).
    """
    import torch

    cuda = device.startswith("cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    host.fill_(7)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {"device": device, "bytes": nbytes, "iters": iters, "pinned": cuda}
    ctx = torch.cuda.device(device) if cuda else _nullcontext()
    with ctx:
        for name, fn in (("h2d_gbps", lambda i: dev.copy_(host, non_blocking=True)),
                         ("d2h_gbps", lambda i: host.copy_(dev, non_blocking=True))):
            common.time_total(fn, 2, device)                      # warm-up
            times = common.time_iterations(fn, iters, device)
            out[name] = nbytes / max(common.median(times), 1e-9) / 1e9
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _sync(*devices: str) -> None:
    import torch

    for d in devices:
        if d.startswith("cuda"):
            torch.cuda.synchronize(d)


def p2p_matrix(devices: list[str], nbytes: int, iters: int) -> dict:
    """Copy bandwidth for every ordered pair of devices (GB/s), timed around ``iters`` copies."""
    import torch

    pairs = []
    bufs = {}
    for i, d in enumerate(devices):
        bufs[i] = torch.empty(nbytes, dtype=torch.uint8, device=d).fill_(i + 1)
    for i, src in enumerate(devices):
        for j, dst in enumerate(devices):
            if i == j:
                continue
            target = torch.empty(nbytes, dtype=torch.uint8, device=dst)
            peer = bool(src.startswith("cuda") and torch.cuda.can_device_access_peer(
                torch.device(src).index, torch.device(dst).index))
            target.copy_(bufs[i])                                   # warm-up (and peer mapping)
            _sync(src, dst)
            t0 = time.perf_counter()
            for _ in range(iters):
                target.copy_(bufs[i], non_blocking=True)
            _sync(src, dst)
            dt = max(time.perf_counter() - t0, 1e-9)
            pairs.append({"src": i, "dst": j, "gbps": nbytes * iters / dt / 1e9, "peer_access": peer})
            del target
    return {"device": "cuda" if devices and devices[0].startswith("cuda") else "cpu", "bytes": nbytes,
            "iters": iters, "pairs": pairs}
