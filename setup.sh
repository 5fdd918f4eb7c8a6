#!/usr/bin/env bash
# Set up gpuproof on this machine: a Python virtualenv in .venv with gpuproof[bench,test,docs] installed (editable),
# and the embedded cluster's control plane (built once from the pinned Go modules into
# ~/.cache/gpuproof, or taken from $GPUPROOF_BIN_DIR / $KUBEBUILDER_ASSETS / PATH).
# Idempotent: a second run takes seconds.
#
#   ./setup.sh                 Python env + control plane
#   ./setup.sh --with-browser  also Debian's chromium (the report tests render HTML in it)
#   ./setup.sh --with-aiperf   also NVIDIA's AIPerf in .venv-aiperf (the load client's parity tests)
set -euo pipefail
cd "$(dirname "$0")"
with_browser=0
with_aiperf=0
for arg in "$@"; do
  case "$arg" in
    --with-browser) with_browser=1 ;;
    --with-aiperf) with_aiperf=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup.sh: gpuproof needs Python 3.10 or newer ($PY is $("$PY" --version 2>&1))" >&2; exit 1
fi
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
echo "[setup] installing gpuproof[bench,test,docs] and its dependencies into .venv (torch is large the first time)"
.venv/bin/python -m pip install -q -e '.[bench,test,docs]'

if [ "$with_aiperf" = 1 ] && [ ! -x .venv-aiperf/bin/aiperf ]; then
  # NVIDIA's AIPerf, for the load client's parity tests, in a venv of its own: its pins would downgrade .venv's
  echo "[setup] installing aiperf 0.13.0 into .venv-aiperf (the inference parity tests compare against it)"
  "$PY" -m venv .venv-aiperf
  .venv-aiperf/bin/python -m pip install -q 'aiperf==0.13.0' tokenizers
fi

if [ "$with_browser" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "[setup] installing chromium (Debian package) for the report tests"
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

# ---- Prometheus (issue #39): Debian's prometheus 2.42, which tests/test_monitoring_prometheus.py starts to scrape
# recorded DCGM exporter outputs. As root with apt-get only, like the kubelet nodes' packages below; without it those
# tests skip (GPUPROOF_REQUIRE_TOOLS=1 fails them). The package enables a system service: the tests start their own
# Prometheus, so one the install started under systemd is stopped and disabled again.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ! command -v prometheus >/dev/null 2>&1; then
  echo "[setup] installing prometheus (Debian package) for the monitoring tests"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
# ---- end of Prometheus -------------------------------------------------------------------------------

echo "[setup] control plane (first build takes 10-15 minutes on 2 cores, then it is cached)"
.venv/bin/gpuproof sim build

# ---- check tools (issue #11): kindcheck (kind's config validation), kind, actionlint ---------------
# Built from pinned Go modules into ~/.cache/gpuproof/tools (about 20 s the first time, then cached).
# gpuproof's tests use them to check kind-configs/ and ci-templates/ (see gpuproof/tools.py).
echo "[setup] check tools (kindcheck, kind, actionlint)"
if ! .venv/bin/python -m gpuproof.tools build; then
  command -v go >/dev/null 2>&1 && exit 1
  echo "[setup] no Go: the check tools are not built (their tests skip; GPUPROOF_REQUIRE_TOOLS=1 fails them)"
fi
# ---- end of check tools ------------------------------------------------------------------------------

# ---- kubelet nodes (issue #28): iptables, ip, nsenter and unshare from Debian; the runtime is built ---------
# Only fleets with `backend: kubelet` pools use them (root and cgroups needed); kwok pools never do. containerd 1.7,
# runc and the CNI plugins are gpuproof's own, built from controlplane/containerd and controlplane/noderuntime (a
# bundle carries them to machines without Go: issue #42).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
   ! { command -v iptables && command -v ip && command -v nsenter && command -v unshare && command -v pkg-config && \
       dpkg -s libseccomp-dev; } >/dev/null 2>&1; then
  echo "[setup] installing iptables, iproute2, util-linux, and libseccomp-dev and pkg-config for runc's static build (Debian packages) for kubelet nodes"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iptables iproute2 util-linux \
    libseccomp-dev pkg-config >/dev/null
fi
if [ "$(id -u)" = 0 ] && command -v go >/dev/null 2>&1; then
  echo "[setup] kubelet, kube-proxy, CoreDNS and NFD's nfd-master for kubelet nodes (built once from controlplane/kube, controlplane/coredns and controlplane/nfd)"
  .venv/bin/python -c 'from gpuproof.sim import clusternet, kubelet; kubelet.kubelet_binary(); kubelet.nfd_master(); clusternet.build()' >/dev/null
  echo "[setup] the kubelet nodes' runtime (containerd 1.7, runc, CNI plugins) and nvidia-cdi-hook (built once from controlplane/containerd, controlplane/noderuntime and controlplane/cdihook)"
  .venv/bin/python -c 'from gpuproof.sim.kubelet import dra, runtime; runtime.locate(); dra.cdi_hook()' >/dev/null
fi
# every kubelet and device plugin holds inotify instances (about 6 a kubelet node); the kernel's default of 128 per
# user runs out at about three lab-sized clusters and NVIDIA's device plugin then exits with "too many open
# files". Raised, never lowered, as kind's documentation advises for its nodes.
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/fs/inotify/max_user_instances ] && \
   [ "$(cat /proc/sys/fs/inotify/max_user_instances)" -lt 512 ]; then
  echo "[setup] fs.inotify.max_user_instances $(cat /proc/sys/fs/inotify/max_user_instances) -> 512 (kubelet nodes)"
  echo 512 > /proc/sys/fs/inotify/max_user_instances
fi
# ---- end of kubelet nodes ----------------------------------------------------------------------------
