"""``gpuproof conformance``: Kubernetes AI Conformance evidence (PRODUCT.yaml, PRODUCT.md) from a finished run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import GpuproofError

DESCRIPTION = """\
Write the evidence folder of a Kubernetes AI Conformance submission from a finished run: PRODUCT.yaml (the
checklist of --version, filled in), PRODUCT.md (rendered from it), and the run's junit.xml, log and checks.jsonl
that its evidence links point at (file://<prefix>/junit.xml#<test>).

A requirement gpuproof tested gets its status from the run: Implemented only when what it needs passed, Not
Implemented when a check of it failed. Everything else (a requirement gpuproof does not test, or one this run
skipped or did not reach) keeps an empty status, with notes saying why, for the platform's own evidence.
Metadata is left as [placeholders] unless given (--vendor, --platform-name, --platform-version, --meta,
--metadata). After writing, the folder is checked against the rules of the CNCF repository's CI (the ones that
can be applied offline) and what is still missing is listed.

RUN is a run folder (reports/<run-id>), a run id under ./reports, or "latest".
"""

EPILOG = """\
examples:
  gpuproof conformance --version 1.37 reports/20261128-101500-a1b2c3 -o v1.37/acme \\
      --vendor "Acme Corp" --platform-name "Acme Kubernetes Service" --platform-version 1.37.2
  gpuproof conformance latest -o evidence --metadata previous/PRODUCT.yaml
  gpuproof conformance --markdown v1.37/acme      rewrite PRODUCT.md after editing PRODUCT.yaml
  gpuproof conformance --check v1.37/acme         the rules; exit 1 while one fails

exit codes: 0 written (or --check found nothing), 1 --check found problems, 2 bad input
"""


def _pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise GpuproofError(f"--meta {item!r}: give KEY=VALUE, e.g. --meta websiteUrl=https://example.com")
        out[key.strip()] = value
    return out


def _metadata_file(path: str) -> dict[str, str]:
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise GpuproofError(f"--metadata {path}: cannot be read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise GpuproofError(f"--metadata {path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if isinstance(data, dict) and isinstance(data.get("metadata"), dict):
        data = data["metadata"]          # a PRODUCT.yaml: its metadata section
    if not isinstance(data, dict):
        raise GpuproofError(f"--metadata {path}: expected a mapping of metadata fields (or a PRODUCT.yaml)")
    data.pop("kubernetesVersion", None)  # the checklist's version is --version's
    return {str(k): "" if v is None else str(v) for k, v in data.items()}


def metadata_overrides(args) -> dict[str, str]:
    meta = _metadata_file(args.metadata) if args.metadata else {}
    meta.update(_pairs(args.meta))
    for key, value in (("vendorName", args.vendor), ("platformName", args.platform_name),
                       ("platformVersion", args.platform_version)):
        if value is not None:
            meta[key] = value
    return meta


def _print_problems(problems: list[str], out=None) -> None:
    for line in problems:
        print(f"  - {line}", file=out or sys.stderr)


def _check(args) -> int:
    from ..report.conformance import check_product

    problems = check_product(args.check)
    if not problems:
        print(f"{args.check}: passes the rules")
        return 0
    print(f"{args.check}: {len(problems)} problem(s):")
    _print_problems(problems, sys.stdout)
    return 1


def _markdown(args) -> int:
    from ..report.conformance import check_product, render_markdown_file

    written = render_markdown_file(args.markdown)
    print(f"wrote {written}")
    problems = check_product(written.parent)
    if problems:
        print(f"still to do before a submission ({len(problems)}):", file=sys.stderr)
        _print_problems(problems)
    return 0


def _conformance(args) -> int:
    if args.check:
        return _check(args)
    if args.markdown:
        return _markdown(args)
    if not args.run or not args.output:
        raise GpuproofError("give a run folder and -o DIR (gpuproof conformance RUN -o DIR), or --check/--markdown "
                            "DIR (see: gpuproof conformance --help)")
    from ..report.conformance import checklist, write_evidence

    version, _ = checklist(args.checklist_version)      # an unknown version: one line, before reading anything
    evidence = write_evidence(args.run, args.output, version, metadata_overrides(args), args.evidence_prefix)
    width = max(len(j.requirement.id) for j in evidence.judgements)
    print(f"wrote {evidence.folder}/PRODUCT.yaml and PRODUCT.md (Kubernetes AI Conformance v{version}):")
    for j in evidence.judgements:
        status = j.status or {"untested": "(not tested by gpuproof)", "absent": "(not in this run)",
                              "skipped": "(skipped in this run)", "incomplete": "(partly tested)"}[j.state]
        print(f"  {j.requirement.id:{width}}  {j.requirement.level:6}  {status}")
    for note in evidence.notes:
        print(f"gpuproof: warning: {note}", file=sys.stderr)
    if evidence.problems:
        print(f"still to do before a submission ({len(evidence.problems)}; gpuproof conformance --check "
              f"{evidence.folder} lists them again):", file=sys.stderr)
        _print_problems(evidence.problems)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "conformance", help="Kubernetes AI Conformance evidence (PRODUCT.yaml, PRODUCT.md) from a finished run",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", metavar="RUN", help="run folder, run id, or latest")
    p.add_argument("-o", "--output", metavar="DIR", help="the evidence folder to write (created if missing)")
    p.add_argument("--version", dest="checklist_version", default="1.37", metavar="X.Y",
                   help="the checklist's version (default and only one known: 1.37)")
    p.add_argument("--evidence-prefix", metavar="PATH", default=None,
                   help="the path in evidence links, file://PATH/junit.xml#... (default: DIR as given; in a "
                        "submission it is the folder's path from the repository root, e.g. v1.37/acme)")
    p.add_argument("--vendor", help="metadata vendorName (the CNCF member's name)")
    p.add_argument("--platform-name", help="metadata platformName")
    p.add_argument("--platform-version", help="metadata platformVersion")
    p.add_argument("--meta", action="append", metavar="KEY=VALUE",
                   help="any metadata field of the checklist, e.g. websiteUrl=https://... (repeatable)")
    p.add_argument("--metadata", metavar="FILE",
                   help="metadata fields from a YAML file: a mapping, or an earlier PRODUCT.yaml")
    p.add_argument("--check", metavar="DIR",
                   help="only check an evidence folder (or its PRODUCT.yaml) against the rules; exit 1 on a problem")
    p.add_argument("--markdown", metavar="DIR",
                   help="only rewrite DIR/PRODUCT.md from DIR/PRODUCT.yaml (after editing it)")
    p.set_defaults(func=_conformance)
