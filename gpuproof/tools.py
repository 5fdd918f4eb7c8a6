"""Go tools that check gpuproof's shipped configs, built from pinned Go modules into the cache.

=============  ===================================================  ==========================================
tool           built from                                           checks
=============  ===================================================  ==========================================
``kindcheck``  ``tools/kindcheck`` (kind's own config loader and     ``kind-configs/*.yaml``, as ``kind create
               ``Validate``, ``sigs.k8s.io/kind`` pinned there)     cluster`` does before it needs Docker
``kind``       ``sigs.k8s.io/kind`` (same version)                   the kind provider's missing-Docker path
``actionlint`` ``github.com/rhysd/actionlint``                      ``ci-templates/github-actions/*.yml``
=============  ===================================================  ==========================================

Each is built once into ``$GPUPROOF_CACHE/tools/<name>-<version>-<key>/`` (default cache
``~/.cache/gpuproof``); the key covers what is built (and, for ``kindcheck``, its sources), so a
change rebuilds, and a built tool is found without Go. ``$GPUPROOF_<NAME>`` (``GPUPROOF_KINDCHECK``,
...) points at a binary instead.

    python -m gpuproof.tools build [NAME...]     # what ./setup.sh runs; seconds when cached
    python -m gpuproof.tools path NAME           # print where NAME is (exit 1 if it is not built)
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .errors import GpuproofError
from .sim.binaries import cache_root

KIND_VERSION = "v0.33.0"          # also pinned in tools/kindcheck/go.mod
ACTIONLINT_VERSION = "v1.7.12"
SOURCES = Path(__file__).resolve().parents[1] / "tools"


class ToolError(GpuproofError):
    """A tool is missing or could not be built; the message says how to get it."""


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    version: str
    package: str            # `go install` target, or "" for a module under tools/
    folder: str = ""        # module folder under tools/ (local modules)

    @property
    def env_var(self) -> str:
        return "GPUPROOF_" + self.name.upper().replace("-", "_")


TOOLS = {
    "kindcheck": Tool("kindcheck", KIND_VERSION, "", folder="kindcheck"),
    "kind": Tool("kind", KIND_VERSION, "sigs.k8s.io/kind"),
    "actionlint": Tool("actionlint", ACTIONLINT_VERSION, "github.com/rhysd/actionlint/cmd/actionlint"),
}


def _tool(name: str) -> Tool:
    try:
        return TOOLS[name]
    except KeyError:
        raise ToolError(f"no tool {name!r}; gpuproof builds {', '.join(TOOLS)}") from None


def _go() -> str:
    go = shutil.which("go")
    if not go:
        raise ToolError("building gpuproof's check tools needs Go 1.22 or newer on PATH (https://go.dev/dl); "
                        "or point at built binaries with " + ", ".join(f"${t.env_var}" for t in TOOLS.values()))
    return go


def _key(tool: Tool) -> str:
    h = hashlib.sha256(f"{tool.package}@{tool.version}".encode())
    if tool.folder:
        folder = SOURCES / tool.folder
        for p in sorted(folder.glob("*")):
            if p.suffix in (".go", ".mod", ".sum"):
                h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def tool_dir(name: str) -> Path:
    tool = _tool(name)
    return cache_root() / "tools" / f"{tool.name}-{tool.version}-{_key(tool)}"


def locate(name: str) -> Path | None:
    """The tool's binary: ``$GPUPROOF_<NAME>`` if set, else the build cache; None when not built."""
    tool = _tool(name)
    var = os.environ.get(tool.env_var)
    if var:
        if not (Path(var).is_file() and os.access(var, os.X_OK)):
            raise ToolError(f"${tool.env_var} is set to {var}, which is not an executable file")
        return Path(var)
    exe = tool_dir(name) / name
    return exe if exe.is_file() and os.access(exe, os.X_OK) else None


def require(name: str) -> Path:
    """The tool's binary, or a ToolError saying how to build it."""
    exe = locate(name)
    if exe is None:
        raise ToolError(f"{name} is not built: run ./setup.sh (or `python -m gpuproof.tools build {name}`), "
                        f"which builds it from pinned Go modules in seconds")
    return exe


def for_test(name: str) -> Path:
    """In gpuproof's tests: the tool's path. A missing tool skips the test, or fails it when
    ``GPUPROOF_REQUIRE_TOOLS=1`` (CI sets it, so a check cannot silently stop running)."""
    import pytest

    try:
        return require(name)
    except ToolError as exc:
        if os.environ.get("GPUPROOF_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{exc} (GPUPROOF_REQUIRE_TOOLS=1 requires it)", pytrace=False)
        raise pytest.skip.Exception(f"{exc}; set GPUPROOF_REQUIRE_TOOLS=1 to make this a failure",
                                    _use_item_location=True) from None


def build(names: list[str] | None = None, progress=None, force: bool = False) -> dict[str, Path]:
    """Build the named tools (default all) into the cache; built ones are kept. Safe to run concurrently."""
    progress = progress or (lambda msg: None)
    names = list(names or TOOLS)
    tools = [_tool(n) for n in names]
    out: dict[str, Path] = {}
    for tool in tools:
        folder = tool_dir(tool.name)
        exe = folder / tool.name
        if exe.is_file() and not force:
            out[tool.name] = exe
            continue
        if tool.folder and not (SOURCES / tool.folder / "go.mod").is_file():
            raise ToolError(f"{tool.name} is built from tools/{tool.folder} of a gpuproof checkout, and this install "
                            f"has none ({SOURCES / tool.folder})")
        go = _go()
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f".{tool.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)       # a second builder waits, then finds the binary
            if exe.is_file() and not force:
                out[tool.name] = exe
                continue
            tmp = folder / f".tmp-{os.getpid()}"
            tmp.mkdir(exist_ok=True)
            t0 = time.monotonic()
            if tool.folder:
                what = f"tools/{tool.folder} (kind {tool.version})"
                cmd, cwd, env = [go, "build", "-trimpath", "-buildvcs=false", "-o", str(tmp / tool.name), "."], \
                    SOURCES / tool.folder, dict(os.environ)
            else:
                what = f"{tool.package}@{tool.version}"
                cmd, cwd, env = [go, "install", "-trimpath", f"{tool.package}@{tool.version}"], \
                    folder, dict(os.environ, GOBIN=str(tmp))
                env.pop("GOFLAGS", None)      # `go install pkg@version` refuses -mod and similar flags
            progress(f"building {tool.name} from {what}")
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not (tmp / tool.name).is_file():
                shutil.rmtree(tmp, ignore_errors=True)
                tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-20:])
                raise ToolError(f"building {tool.name} from {what} failed (exit {proc.returncode}):\n{tail}")
            (tmp / tool.name).replace(exe)
            shutil.rmtree(tmp, ignore_errors=True)
            progress(f"built {tool.name} in {time.monotonic() - t0:.0f}s: {exe}")
            out[tool.name] = exe
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuproof.tools",
                                     description="Build or find the Go tools that check gpuproof's shipped configs.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the tools (default: all) into the cache")
    b.add_argument("names", nargs="*", metavar="NAME", help=", ".join(TOOLS))
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    p = sub.add_parser("path", help="print a tool's path; exit 1 when it is not built")
    p.add_argument("name", metavar="NAME", help=", ".join(TOOLS))
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            for name, exe in build(args.names, progress=lambda m: print(f"[tools] {m}", file=sys.stderr),
                                   force=args.force).items():
                print(f"{name:<11} {exe}")
            return 0
        print(require(args.name))
        return 0
    except GpuproofError as exc:
        print(f"gpuproof: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
