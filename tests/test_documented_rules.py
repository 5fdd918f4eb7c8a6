"""Every rules file the project ships or documents judges records the benchmarks really write (issue #40 item 2).

A copied rule that matches no record judges nothing, silently (``gpuproof report check`` counts the rows no rule
matches and judges none of them): reports/README.md's example once named ``inference/latency_p9[59]_ms``, which no
benchmark wrote. The rules are read from the documents themselves:

- the ```yaml blocks holding ``rules:`` in README.md, reports/README.md, deploy/cronjob/README.md and the documentation
  site's pages (docs/);
- the nightly's ``rules.yaml`` in deploy/cronjob/config.yaml (the ConfigMap the CronJob mounts);
- the example in gpuproof/report/baseline.py's docstring (the rules format's reference).

The records are the benchmarks' own ``to_records`` of recorded results (tests/data/results/: matmul on an H100,
all-reduce over 2 gloo ranks and inference on the CPU) and of an hbm result in its workload's shape.
tests/test_upgrade_loop.py (server tier) applies the same documents' rules to the records of real CPU runs.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from gpuproof.bench import get
from gpuproof.report import baseline
from gpuproof.report.baseline import parse_rules

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "data" / "results"
RECORDED = {"matmul": "h100-matmul.json", "allreduce": "cpu-allreduce.json", "inference": "cpu-inference.json"}
HBM_RESULT = {"device": "cuda", "device_name": "NVIDIA H200", "memory": "HBM3e",
              "results": [{"kernel": "copy", "size_bytes": 2 ** 30, "iters": 20, "gbps": 3900.0, "median_ms": 0.55,
                           "ratio_to_peak": 0.81, "peak_gbps": 4800.0, "check_ok": True}]}
MARKDOWN = ("README.md", "reports/README.md", "deploy/cronjob/README.md",
            *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))
# where rules are documented today: a reader that finds none there has broken, not the docs
MUST_HOLD_RULES = {"reports/README.md", "deploy/cronjob/config.yaml", "gpuproof/report/baseline.py"}


def documented() -> dict[str, str]:
    """Each rules file the project ships or documents, as YAML text, by where it is."""
    out = {}
    for where in MARKDOWN:
        blocks = [b for b in re.findall(r"```yaml\n(.*?)```", (ROOT / where).read_text(), re.S) if "rules:" in b]
        for i, block in enumerate(blocks):
            out[where + (f" #{i + 1}" if len(blocks) > 1 else "")] = block
    config = yaml.safe_load((ROOT / "deploy" / "cronjob" / "config.yaml").read_text())
    out["deploy/cronjob/config.yaml"] = config["data"]["rules.yaml"]
    example = re.search(r"::\n\n((?:    .*\n|\n)+)", baseline.__doc__)
    out["gpuproof/report/baseline.py"] = textwrap.dedent(example.group(1)) if example else ""
    return out


def rules() -> list[tuple[str, object]]:
    return [(where, rule) for where, text in documented().items() for rule in parse_rules(yaml.safe_load(text),
                                                                                          where)]


def benchmark_records() -> list:
    """What the benchmarks' own to_records write from recorded results (and an hbm result)."""
    recs = []
    for name, file in RECORDED.items():
        recs += get(name).to_records(json.loads((RESULTS / file).read_text()), node="n", product="P")
    return recs + get("hbm").to_records(HBM_RESULT, node="n", product="P")


def test_every_place_that_documents_rules_is_read():
    """The reader finds the rules where they are documented (an empty reading would pass every rule check)."""
    found = {where.split(" #")[0] for where, _ in rules()}
    assert MUST_HOLD_RULES <= found, f"no rules read from {sorted(MUST_HOLD_RULES - found)}"


@pytest.mark.parametrize("where,rule", rules(), ids=lambda x: x if isinstance(x, str) else x.metric)
def test_a_documented_rule_judges_a_record_a_benchmark_writes(where, rule):
    """Each documented rule matches at least one record (benchmark/metric and its parameter filter). Today:

    - reports/README.md: ``matmul/tflops`` (dtype fp16 or bf16), ``hbm/bandwidth_gbps``, ``re:^inference/p9[09]_ms$``;
    - deploy/cronjob/config.yaml: ``matmul/tflops``, ``hbm/bandwidth_gbps``, ``allreduce/avg_busbw_gbps``,
      ``re:^inference/(ttft|tpot)_p(50|99)_ms$``;
    - gpuproof/report/baseline.py: ``matmul/tflops`` (dtype bf16), ``re:inference/p9[09]_ms``;
    - README.md, deploy/cronjob/README.md and docs/: none (they point to the two above; docs/reports.md renders
      reports/README.md, not a copy)."""
    hits = [f"{r.benchmark}/{r.metric}" for r in benchmark_records()
            if rule.matches(r.benchmark, r.metric, r.as_row()["parameters"])]
    assert hits, f"{where}: rule {rule.metric!r} ({rule.parameters or 'any parameters'}) judges no record a " \
                 f"benchmark writes"
