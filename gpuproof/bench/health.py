"""The ``health`` benchmark: workloads/health.py on this host or in a pod on one GPU node.

The workload reports items ``{name, gpu, value, threshold, verdict, reason}`` (verdict
pass | warn | fail | unavailable). Records, per item:

- ``<item name>`` with the item's value when it is a number (ECC counts, links up, GB/s, ...);
- ``verdict`` (unit ``score``): 1 pass, 0.5 warn, 0 fail, -1 unavailable, with the item
  name, GPU and threshold in the parameters (so runs join on them and a pass turning
  into a fail shows as a drop).

Thresholds are the workload's flags (``params["thresholds"] = {"copy_min_gbps": 20}``);
on a cluster ``GPUPROOF_HEALTH_ARGS`` adds raw flags (e.g. ``--dcgm-level 2``).
"""

from __future__ import annotations

import os
import shlex

from ..results import MetricRecord
from .base import NodeBenchmark, flag_args, register

ARGS_ENV = "GPUPROOF_HEALTH_ARGS"
VERDICT_SCORE = {"pass": 1.0, "warn": 0.5, "fail": 0.0, "unavailable": -1.0}


def extra_args_from_env() -> list[str]:
    """Extra workload flags from ``GPUPROOF_HEALTH_ARGS`` (shell words), e.g. '--copy-min-gbps 20'."""
    return shlex.split(os.environ.get(ARGS_ENV, ""))


@register
class Health(NodeBenchmark):
    name = "health"
    script = "health"
    description = ("GPU health: GPU reachable, XIDs, ECC and SRAM ECC, retired pages / remapped rows, throttling "
                   "under load, PCIe, NVLink links, errors and fabric health, persistence, power limit, host<->GPU "
                   "and GPU<->GPU copy bandwidth, dcgmi diag")
    defaults = {"load_s": 5.0, "load_size": None, "copy_mib": 256, "copy_iters": 10, "dcgm_level": 1,
                "no_p2p": False, "threads": None, "thresholds": None, "extra_args": None}
    cpu_defaults = {"load_s": 1.0, "copy_mib": 32, "copy_iters": 5}
    ci_params = {"load_s": 0.3, "copy_mib": 8, "copy_iters": 3, "threads": 1}
    flags = {"device": "--device", "load_s": "--load-s", "load_size": "--load-size", "copy_mib": "--copy-mib",
             "copy_iters": "--copy-iters", "dcgm_level": "--dcgm-level", "no_p2p": "--no-p2p",
             "threads": "--threads"}
    timeout_s = 1800

    def headline(self, result: dict) -> str:
        return headline(result)

    def workload_args(self, params: dict) -> list[str]:
        args = flag_args(params, self.flags)
        for key, value in sorted((params.get("thresholds") or {}).items()):
            if isinstance(value, (set, list, tuple)):
                value = ",".join(map(str, sorted(value)))
            args += [f"--{key.replace('_', '-')}", str(value)]
        return args + list(params.get("extra_args") or [])

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        recs = []
        for it in result.get("items") or []:
            p = {"device": result.get("device"), "item": it["name"], "gpu": it.get("gpu"), "uuid": it.get("uuid"),
                 "threshold": it.get("threshold")}
            recs.append(self.record("verdict", VERDICT_SCORE[it["verdict"]], "score", p, node, product))
            value = it.get("value")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                recs.append(self.record(it["name"], value, it.get("unit") or "", p, node, product))
        recs.append(self.record("items_failed", (result.get("summary") or {}).get("fail"), "count",
                                {"device": result.get("device")}, node, product))
        return [r for r in recs if r is not None]


def _workload():
    from .workloads import import_workload

    return import_workload("health")


def headline(result: dict) -> str:
    """The workload's own summary line: verdict counts and the GPUs NVML listed, by UUID."""
    return _workload().headline(result)


def failed_items(result: dict) -> list[dict]:
    return [it for it in result.get("items") or [] if it.get("verdict") == "fail"]


def record_checks(check, result: dict, target: str | None = None) -> None:
    """Each item as a check record: fail -> failed check (node, GPU index and UUID, threshold as expected, value
    as actual), warn -> warning, pass -> pass, unavailable -> skip with the reason. ``check`` is a Checker."""
    label = _workload().gpu_label
    for it in result.get("items") or []:
        what = f"{label(it)}{it['name']}: {it.get('reason')}"
        verdict = it["verdict"]
        if verdict == "fail":
            check.true(it["name"], False, it.get("threshold"), it.get("value"), what=what, target=target)
        elif verdict == "warn":
            check.warn(it["name"], what, expected=it.get("threshold"), actual=it.get("value"), target=target)
        elif verdict == "pass":
            check.record(it["name"], "pass", it.get("threshold"), it.get("value"), what, target=target)
        else:
            check.record(it["name"], "skip", it.get("threshold"), it.get("value"), f"unavailable: {what}",
                         target=target)
