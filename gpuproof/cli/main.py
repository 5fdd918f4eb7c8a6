"""The one command line: ``gpuproof <command>``. Run ``gpuproof --help``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .. import __version__
from ..errors import GpuproofError, one_line

# Each module named here has register(subparsers) adding its commands; each command
# sets func=callable(args) -> int. Modules are imported lazily so --help stays fast.
COMMAND_MODULES = [
    "gpuproof.cli.run",           # gpuproof run: the acceptance suite (+ benchmarks)
    "gpuproof.cli.plan",          # gpuproof plan: what a run would create, where (creates nothing)
    "gpuproof.cli.sim",           # gpuproof sim up|status|down|build
    "gpuproof.cli.clean",         # gpuproof clean
    "gpuproof.cli.bench",         # gpuproof bench --local ...
    "gpuproof.cli.report",        # gpuproof report compare|baseline|check|html
    "gpuproof.cli.conformance",   # gpuproof conformance: Kubernetes AI Conformance evidence from a run
]

DESCRIPTION = """\
Acceptance and benchmark suite for GPU Kubernetes clusters.

By default everything runs against an embedded cluster (real kube-apiserver,
scheduler, controller-manager and etcd, with kwok nodes that advertise GPUs as the
NVIDIA device plugin and GPU Feature Discovery do, or publish them as NVIDIA's DRA
driver does). A real cluster is used only when you name it with --kubeconfig /
--context.
"""

EPILOG = """\
examples:
  gpuproof run                          suite against the embedded cluster (mixed fleet)
  gpuproof run --kubeconfig ~/.kube/config --context prod-gpu
  gpuproof plan --kubeconfig ~/.kube/config --context prod-gpu   what a run would create (creates nothing)
  gpuproof sim up --fleet mixed          keep an embedded cluster running
  gpuproof bench --local matmul         benchmark this machine's GPU (or CPU)
  gpuproof report compare reports/A reports/B
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported in one line (argparse prints the usage block first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpuproof",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuproof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command module not written yet
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        if args.command in ("run", "sim") and os.environ.get("GPUPROOF_BUNDLE"):
            from ..sim import bundle       # the embedded cluster's programs, installed into the cache once

            bundle.from_env(lambda msg: print(f"[gpuproof] {msg}", file=sys.stderr, flush=True))
        return int(args.func(args) or 0)
    except GpuproofError as exc:
        print(f"gpuproof: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("gpuproof: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:               # output piped into head & co.
        sys.stderr.close()
        return 1
    except OSError as exc:                # a file named on the command line that cannot be read or written
        where = f": {exc.filename}" if exc.filename else ""
        print(f"gpuproof: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except Exception as exc:              # a bug: one line, the traceback on request
        if os.environ.get("GPUPROOF_DEBUG"):
            raise
        print(f"gpuproof: internal error: {type(exc).__name__}: {one_line(exc)} "
              "(GPUPROOF_DEBUG=1 shows the traceback; please report it)", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
