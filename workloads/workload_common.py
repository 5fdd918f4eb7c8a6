"""Helpers shared by the workloads (stdlib only; torch and pynvml are imported lazily).

The files in this folder are shipped into pods as one ConfigMap and run with a stock
PyTorch image, so nothing here may import the ``gpuproof`` package. Sibling modules
import each other by plain name (hence the unusual, clash-free module names): the folder of the running script is on
``sys.path``.

Conventions every workload follows:

- the result is exactly one JSON object, printed as the last line on stdout (:func:`emit`);
- progress and diagnostics go to stderr (:func:`log`);
- the exit status is 0 when the workload ran and its checks passed, 1 when it ran and a
  check failed, 2 for bad arguments or an environment that cannot run it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import sys
import time
from typing import Any, Iterable, Sequence

SCHEMA_VERSION = 1

# --------------------------------------------------------------------------- output


def log(msg: str) -> None:
    """Progress for humans: stderr, so stdout stays one JSON line."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def emit(result: dict) -> None:
    """Print the workload's result: one JSON object on one line of stdout."""
    sys.stdout.write(json.dumps(result, sort_keys=True, default=_json_default, allow_nan=False) + "\n")
    sys.stdout.flush()


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    return str(obj)


def finite_or_none(x: float | None) -> float | None:
    """JSON has no NaN/inf: those become null."""
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def base_result(workload: str) -> dict:
    return {
        "workload": workload,
        "schema": SCHEMA_VERSION,
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")},
    }


def parser(prog: str, description: str, epilog: str = "") -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to run: cuda if a GPU is visible (auto, the default), or force cpu / cuda",
    )
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads torch may use (default 0: torch's own choice)")


def setup_device(args: argparse.Namespace) -> str:
    """Apply --threads and resolve --device; returns 'cuda' or 'cpu'."""
    import torch

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    return resolve_device(args.device)


def resolve_device(choice: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'. 'cuda' without a GPU is an error."""
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit(fail_usage("--device cuda asked for, but torch sees no CUDA device "
                                    f"(torch {torch.__version__}, CUDA build {torch.version.cuda})"))
    return choice


def fail_usage(message: str) -> int:
    """Report an environment/argument problem as the JSON result too, and return exit code 2."""
    log(f"error: {message}")
    emit({"ok": False, "error": message})
    return 2


# --------------------------------------------------------------------------- NVML

# NVML return codes that mean the GPU itself is gone, not that a query is unsupported (nvml.h).
NVML_GPU_GONE = {15: "GPU is lost", 16: "GPU requires a reset"}


def load_nvml():
    """(pynvml, None) when NVML initialises, else (None, why not).

    Whatever torch sees: NVML is NVIDIA's own view of the GPUs, and reading it needs no CUDA
    (an image whose CUDA is newer than the driver still has NVML)."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML unavailable: {exc}"
    return pynvml, None


def nvml_str(value) -> str:
    """NVML strings: bytes from nvidia-ml-py < 11.5, str after."""
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gone(exc: BaseException) -> str | None:
    """Why the GPU is gone when an NVML error says so (GPU is lost, reset required), else None."""
    code = getattr(exc, "value", None)
    return f"NVML: {exc}" if code in NVML_GPU_GONE else None


_NVML_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def nvml_value(value, value_type: int):
    """The number in an NVML value union (c_nvmlValue_t), by its nvmlValueType_t."""
    return getattr(value, _NVML_VALUE_ATTR.get(value_type, "ullVal"))


def nvml_field(fv):
    """The value of one nvmlFieldValue_t, or None when NVML returned an error for it."""
    if getattr(fv, "nvmlReturn", 0) != 0:
        return None
    return nvml_value(fv.value, getattr(fv, "valueType", 3))


# --------------------------------------------------------------------------- sizes

_UNITS = {
    "": 1, "B": 1,
    "K": 1024, "KB": 1000, "KIB": 1024,
    "M": 1024**2, "MB": 1000**2, "MIB": 1024**2,
    "G": 1024**3, "GB": 1000**3, "GIB": 1024**3,
}


def parse_bytes(text: str) -> int:
    """'8', '8B', '64K', '1MiB', '1GB' -> bytes. A bare K/M/G is binary (like nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 8, 64K, 1MiB, 1G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def geometric_sizes(lo: int, hi: int, factor: int = 2) -> list[int]:
    """lo, lo*factor, ... up to and including hi (nccl-tests -b/-e/-f)."""
    if lo <= 0 or hi < lo or factor < 2:
        raise ValueError(f"need 0 < min <= max and factor >= 2 (got {lo}, {hi}, {factor})")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def parse_int_list(text: str) -> list[int]:
    return [int(x) for x in str(text).replace(" ", "").split(",") if x]


def parse_float_list(text: str) -> list[float]:
    return [float(x) for x in str(text).replace(" ", "").split(",") if x]


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float | None:
    """Exact percentile with linear interpolation between order statistics.

    Same definition as numpy's default ("linear", R type 7): p(q) = x[h] with
    h = (n-1)*q/100 interpolated. No buckets, no rounding.
    """
    if not values:
        return None
    xs = sorted(values)
    if not 0 <= q <= 100:
        raise ValueError("q must be within [0, 100]")
    h = (len(xs) - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50)


def mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


# --------------------------------------------------------------------------- ports


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS had free a moment ago (bind to port 0). Prefer binding port 0 yourself."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- timing


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_iterations(fn, iters: int, device: str) -> list[float]:
    """Seconds per call of ``fn(i)`` for each of ``iters`` calls.

    On CUDA each call is bracketed by CUDA events recorded on the current stream, and
    the host synchronizes once at the end (no per-iteration host sync, so launches
    queue back to back); on the CPU, time.perf_counter around each call.
    """
    if device.startswith("cuda"):
        import torch

        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        torch.cuda.synchronize()
        for i in range(iters):
            starts[i].record()
            fn(i)
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    out = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def time_total(fn, iters: int, device: str) -> float:
    """Seconds for ``iters`` back-to-back calls of ``fn(i)`` (events / perf_counter)."""
    if device.startswith("cuda"):
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for i in range(iters):
            fn(i)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for i in range(iters):
        fn(i)
    return time.perf_counter() - t0


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.cuda.current_device())
    import platform

    return platform.processor() or platform.machine() or "cpu"


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate()`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # keep polling; report the last error on timeout
            last_exc = exc
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_exc})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)
