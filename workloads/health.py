"""GPU health inside a pod (or on this host): NVML health readings, a short load, copy bandwidth, DCGM.

NVML is read whenever the library loads, whatever torch sees: the GPUs are enumerated through
NVML, so a GPU that CUDA cannot use (an image whose CUDA is newer than the driver, a GPU
fallen off the bus) is still checked. CUDA is needed only for the parts that compute (the load
under which throttling and PCIe are read, the copies); without it those items say so.

Per GPU NVML lists:

- ``gpu_reachable``: NVML answers for the GPU (a lost GPU, fallen off the bus or needing a
  reset, fails here; its other readings are then not trusted);
- XID critical errors seen during the run (an NVML event set, polled while the workload
  runs) and XIDs since boot from the kernel log when it is readable (``/dev/kmsg``, then
  ``dmesg``; usually not readable in a pod, then reported "unavailable");
- ECC mode and volatile / aggregate corrected and uncorrected ECC error counts; SRAM ECC
  (uncorrectable SRAM errors, NVML's SRAM error threshold);
- retired pages (count, pending) and remapped rows (pending, failure, uncorrectable);
- clock-event (throttle) reasons seen DURING a short matmul burst on every GPU (without CUDA
  the GPUs are idle, and the item says so);
- PCIe link generation and width read during that load, against the maximum this GPU
  and system support (links downtrain at idle, so an idle reading only warns);
- NVLink links up (state of every link NVML reports), NVLink data-link errors (replay,
  recovery, CRC) counted during the run, NVLink fabric health (NVSwitch / GB200 fabrics);
- persistence mode, the enforced power limit against the default;
- host-to-device and device-to-host copy bandwidth (pinned memory), and a GPU-to-GPU copy
  bandwidth matrix over all visible GPUs;
- ``dcgmi diag -r 1`` (``--dcgm-level 2`` for -r 2) when the image has DCGM;
- ``torch_errors``: a CUDA error raised by the load or a copy fails the run as an item
  (a sick GPU gives a verdict, not a traceback).

Every reading becomes an item ``{name, gpu, uuid, value, threshold, verdict, reason}`` with
verdict pass | warn | fail | unavailable. Where NVML answers Not Supported the item is
"unavailable" with that answer, never a pass. Thresholds are in :data:`THRESHOLDS` (each one
a command-line flag; the table is in workloads/README.md).

The evaluation is pure: :func:`evaluate_gpu` and friends take plain dicts of readings, so
faults can be fed as data. Only :class:`NvmlReader`, :class:`XidWatcher` and the torch
parts touch hardware. Without NVML every GPU item is "unavailable" with the reason, and the
copy-bandwidth code paths still run on CPU tensors.

Prints one JSON object on stdout; exit 0 when no item failed, 1 when one did.

This file is the workload (its options and its run); its parts are health_rules.py (thresholds and verdicts),
health_nvml.py (NVML readings), health_host.py (kernel log, driver files, DCGM) and health_torch.py (the load and
the copies), re-exported here so ``health.<name>`` keeps naming them all.
"""

from __future__ import annotations

import shutil  # noqa: F401  (health.shutil: what tests/test_health.py patches for run_dcgm)
import sys
import time

import workload_common as common

# the parts, re-exported: health.<name> names every one of them (tests, census.py)
from health_rules import *  # noqa: E402
from health_host import *  # noqa: E402
from health_nvml import *  # noqa: E402
from health_torch import *  # noqa: E402
from health_torch import _nullcontext  # noqa: E402  (private: a star import leaves it out; census.py uses it too)

# --------------------------------------------------------------------------- the workload


def build_parser():
    p = common.parser(
        "health.py",
        "GPU health: XIDs, ECC, retired pages / remapped rows, throttling under load, PCIe and NVLink links, "
        "persistence, power limit, copy bandwidth (host<->GPU, GPU<->GPU), dcgmi diag.",
        epilog="examples:\n  python health.py\n  python health.py --device cpu\n"
               "  python health.py --dcgm-level 2 --copy-min-gbps 20 --throttle-fail hw_slowdown\n",
    )
    common.add_device_arg(p)
    p.add_argument("--load-s", type=float, default=5.0,
                   help="seconds of matmul load on every GPU while throttling and PCIe are read (default 5)")
    p.add_argument("--load-size", type=int, default=None, help="matmul size N (default 8192 on GPUs, 256 on the CPU)")
    p.add_argument("--sample-hz", type=float, default=10.0, help="NVML readings per second during the load")
    p.add_argument("--copy-mib", type=int, default=256, help="bytes per copy in MiB (default 256)")
    p.add_argument("--copy-iters", type=int, default=10, help="timed copies per direction / pair (default 10)")
    p.add_argument("--dcgm-level", type=int, default=1, choices=(0, 1, 2, 3),
                   help="run `dcgmi diag -r LEVEL` when dcgmi is in the image (default 1; 0 = off)")
    p.add_argument("--dcgm-timeout-s", type=float, default=900.0, help="give dcgmi diag this long (default 900)")
    p.add_argument("--no-kernel-log", action="store_true", help="do not try to read XIDs from the kernel log")
    p.add_argument("--no-p2p", action="store_true", help="skip the GPU-to-GPU copy matrix")
    g = p.add_argument_group("thresholds (see workloads/README.md)")
    for name, (default, _kind, text) in THRESHOLDS.items():
        g.add_argument(f"--{name.replace('_', '-')}", dest=f"t_{name}", default=None, metavar="V",
                       help=f"{text} (default {default if default is not None else 'the maximum'})")
    return p


def thresholds_from_args(args) -> dict:
    return resolve_thresholds({name: getattr(args, f"t_{name}") for name in THRESHOLDS
                               if getattr(args, f"t_{name}") is not None})


def summarize(items: list[dict]) -> dict:
    counts = {v: 0 for v in VERDICTS}
    for it in items:
        counts[it["verdict"]] += 1
    return counts


def _jsonable_thresholds(t: dict) -> dict:
    return {k: sorted(v) if isinstance(v, set) else v for k, v in t.items()}


def open_nvml() -> tuple[NvmlReader | None, str | None]:
    """The NVML reader over every GPU NVML lists (identities read), or (None, why not)."""
    nvml, why = common.load_nvml()
    if nvml is None:
        return None, why
    try:
        reader = NvmlReader(nvml)
    except Exception as exc:
        return None, f"NVML could not list devices: {exc}"
    if not reader.readings:
        return None, "NVML sees no GPU"
    return reader, None


def attach_copies(readings: list[dict], copies: list[dict], cuda_devices: list[str], cuda_reason: str | None,
                  torch) -> None:
    """Give each NVML GPU the copy bandwidth torch measured on it (matched by UUID: torch lacks the GPU- prefix)."""
    by_uuid = {}
    for d in cuda_devices:
        u = getattr(torch.cuda.get_device_properties(d), "uuid", None)
        if u is not None:
            by_uuid[str(u).lower()] = d
    for r in readings:
        d = by_uuid.get(str(r.get("uuid") or "").lower().removeprefix("gpu-"))
        if d is None and len(readings) == 1 and len(cuda_devices) == 1:
            d = cuda_devices[0]     # a MIG slice: torch sees the MIG device, NVML its parent GPU
        c = next((c for c in copies if c["device"] == d), None)
        for key in ("h2d_gbps", "d2h_gbps"):
            r[key] = c[key] if c else None
            if not c:
                r["unavailable"][key] = (f"{cuda_reason}: host<->GPU copies need CUDA" if cuda_reason else
                                         "torch has no CUDA device with this GPU's UUID")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        thresholds = thresholds_from_args(args)
    except ValueError as exc:
        return common.fail_usage(str(exc))
    import torch

    t_start = time.monotonic()
    device = common.setup_device(args)
    result = common.base_result("health")
    result.update(device=device, torch=torch.__version__, thresholds=_jsonable_thresholds(thresholds))
    cuda_reason = None if device == "cuda" else "no CUDA device (--device cpu)" if args.device == "cpu" else \
        f"no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}, sees none)"
    reader, nvml_reason = open_nvml()           # whatever torch sees: NVML is NVIDIA's own view of the GPUs
    nvml = reader.nvml if reader else None
    readings = reader.readings if reader else []
    cuda_devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if device == "cuda" else []
    result["driver"] = driver_proc_info()

    size = args.load_size or (8192 if device == "cuda" else 256)
    errors: list[dict] = []

    def guarded(what: str, fn, *fn_args):
        """Run a torch step; a CUDA error (a sick GPU) becomes an error entry, not a crash."""
        try:
            return fn(*fn_args)
        except (RuntimeError, MemoryError) as exc:   # torch.cuda errors are RuntimeErrors
            errors.append({"what": what, "error": str(exc).strip().splitlines()[0][:300] if str(exc) else repr(exc)})
            common.log(f"error in {what}: {errors[-1]['error']}")
            return None

    xid = XidWatcher(nvml, reader) if reader else None
    with (xid or _nullcontext()):     # XIDs raised while the GPUs are read count too
        if reader:
            reader.read_static()
        common.log(f"load: {args.load_s:.1f}s of {size}x{size} matmuls on {cuda_devices or ['cpu']}")
        with (LoadWatcher(reader, args.sample_hz, on_gpu=bool(cuda_devices)) if reader else _nullcontext()):
            result["load"] = guarded("matmul load", matmul_burst, cuda_devices or ["cpu"], args.load_s, size)
        nbytes = args.copy_mib * 2**20
        copies = []
        for d in cuda_devices or ["cpu"]:
            c = guarded(f"copies on {d}", copy_bandwidth, d, nbytes, args.copy_iters)
            if c:
                copies.append(c)
                common.log(f"copy {d}: H2D {c['h2d_gbps']:.2f} GB/s, D2H {c['d2h_gbps']:.2f} GB/s")
        result["copies"] = copies
        if args.no_p2p:
            p2p = {"pairs": [], "reason": "turned off (--no-p2p)", "device": device}
        elif device == "cuda" and len(cuda_devices) < 2:
            p2p = {"pairs": [], "reason": f"{len(cuda_devices)} GPU visible: no pair to copy between",
                   "device": device}
        else:
            p2p = guarded("GPU-to-GPU copies", p2p_matrix, cuda_devices or ["cpu", "cpu"],
                          min(nbytes, 64 * 2**20) if device == "cpu" else nbytes, args.copy_iters) or \
                {"pairs": [], "reason": "the copies failed (see torch_errors)", "device": device}
            if device == "cpu":
                p2p["reason"] = cuda_reason
        result["p2p"] = p2p
        # inside the XID window: the diagnostic stresses the GPUs too (DCGM reads the GPUs without CUDA)
        result["dcgm"] = run_dcgm(args.dcgm_level, args.dcgm_timeout_s) if reader else \
            {"level": args.dcgm_level, "reason": nvml_reason}
    result["torch_errors"] = errors

    if reader:
        reader.read_nvlink_errors("nvlink_errors_end")
        fold_kernel_xids(readings, *((None, "turned off (--no-kernel-log)") if args.no_kernel_log
                                     else read_kernel_log()))
        attach_copies(readings, copies, cuda_devices, cuda_reason, torch)
    else:   # no NVML: one set of items, every one unavailable with the reason
        c = copies[0] if copies else {}
        readings = [{"index": None, "uuid": None, "reason": nvml_reason, "unavailable": {},
                     "copy_device": "cpu" if device == "cpu" else None,
                     "h2d_gbps": c.get("h2d_gbps") if device == "cpu" else None,
                     "d2h_gbps": c.get("d2h_gbps") if device == "cpu" else None}]
        if device == "cuda":
            readings[0]["unavailable"].update(h2d_gbps=nvml_reason, d2h_gbps=nvml_reason)

    items = []
    for r in readings:
        items += evaluate_gpu(r, thresholds)
    items += evaluate_p2p(p2p, thresholds)
    items.append(evaluate_errors(errors, device, cuda_reason))
    items += evaluate_dcgm(result["dcgm"])

    result["nvml"] = {"available": reader is not None, "reason": nvml_reason,
                      "driver_version": _driver_version(nvml)}
    result["cuda"] = {"available": not cuda_reason, "reason": cuda_reason, "devices": len(cuda_devices)}
    # what gpuproof bench reports about sampling: the load watcher above is this workload's sampler
    result["utilization"] = {"available": reader is not None, "reason": nvml_reason, "phases": {}}
    result["gpus"] = [{k: r.get(k) for k in ("index", "uuid", "name", "pci_bus_id")} for r in readings
                      if r.get("index") is not None]
    result["readings"] = readings
    result["items"] = items
    result["summary"] = summarize(items)
    result["failed"] = [f"{gpu_label(i)}{i['name']}: {i['reason']}" for i in items if i["verdict"] == "fail"]
    result["ok"] = not result["failed"]
    result["elapsed_s"] = round(time.monotonic() - t_start, 3)
    for f in result["failed"]:
        common.log(f"FAIL {f}")
    common.log(f"health: {headline(result)}")
    common.emit(result)
    return 0 if result["ok"] else 1


def gpu_label(it: dict) -> str:
    """'GPU 3 (GPU-0100...): ' for an item of one GPU, '' for a node-wide one."""
    if it.get("gpu") is None:
        return ""
    return f"GPU {it['gpu']}" + (f" ({it['uuid']})" if it.get("uuid") else "") + ": "


def headline(result: dict) -> str:
    """One line: the verdict counts and the GPUs NVML listed, by UUID (gpuproof bench prints it)."""
    s = result.get("summary") or {}
    gpus = result.get("gpus") or []
    counts = ", ".join(f"{s.get(v, 0)} {v}" for v in VERDICTS)
    seen = (f"{len(gpus)} GPU(s) through NVML: {', '.join(str(g.get('uuid') or g.get('index')) for g in gpus)}"
            if gpus else f"0 GPU(s): {(result.get('nvml') or {}).get('reason')}")
    cuda = (result.get("cuda") or {}).get("reason")
    return f"{counts} items on {seen}" + (f"; {cuda}" if cuda else "") + \
        (f" ({result['elapsed_s']:.1f}s)" if result.get("elapsed_s") is not None else "")


def _driver_version(nvml) -> str | None:
    try:
        return common.nvml_str(nvml.nvmlSystemGetDriverVersion()) if nvml else None
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
