#!/usr/bin/env bash
# Every GPU path of gpuproof in one run, for a lent GPU machine (benchmarks/RESULTS.md, "GPU run").
#
#   bash benchmarks/gpu_run.sh [OUTDIR]        # OUTDIR defaults to $OUT, else ./gpu-run
#
# Each step has its own time limit (so one that hangs costs its limit, not the run) and its
# output goes to OUTDIR/log; the records (reports/gpu-<step>/, or under $GPU_RUN_REPORTS) are packed
# into OUTDIR/reports.tgz. tests/test_gpu_run_script.py dry-runs it on the CPU.
# Python packages the machine lacks (locust, kubernetes, ...) are installed from ./.whl when that
# folder holds wheels (see RESULTS.md for the download command). Steps, in order of how much
# their figures are needed: probe, health, matmul, matmul vs a bare torch loop, HBM, the NVML
# sampler's cost, per-call NVML cost, inference capacity and bound_by.
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-run}}
mkdir -p "$out"
log=$out/log
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl >>"$log" 2>&1 && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

DEV=${GPU_RUN_DEVICE:-cuda}     # cpu: a dry run of the script itself on a machine without a GPU
ONLY=${GPU_RUN_STEPS:-}         # e.g. "probe hbm": only those steps
REPORTS=${GPU_RUN_REPORTS:-reports}   # the run folders (gpu-<step>) go here
step() {  # step NAME LIMIT_S command...
    local name=$1 limit=$2; shift 2
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    echo "=== $(date +%T) $name (limit ${limit}s): $*" | tee -a "$log"
    timeout -k 5 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    echo "=== $(date +%T) $name rc=$rc" | tee -a "$log"
}
bench() { step "$1" "$2" $PY -m gpuproof bench --local "$1" --device "$DEV" --out "$REPORTS" --run-id "gpu-$1" "${@:3}"; }

step smi 20 nvidia-smi
step versions 30 $PY -c 'import sys, torch, pynvml; print(sys.version.split()[0], torch.__version__,
torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA")'
bench probe 60
bench health 120
bench census 60
bench matmul 120
step vs_torch 120 $PY benchmarks/matmul_vs_torch.py --device "$DEV" --dtypes bf16,fp16,tf32,fp32,fp8 \
    --sizes 4096,8192 --trials 3 --json "$out/vs_torch.json"
bench hbm 90
step sampler 60 $PY benchmarks/sampler_overhead.py --seconds 10 --hz 10 --json "$out/sampler.json"
if [ -f .whl/nvml_calls.py ]; then step nvml_calls 30 $PY .whl/nvml_calls.py; fi
bench inference "${GPU_RUN_INFERENCE_S:-240}"
# the embedded cluster over this machine's GPUs (issue #42 item 4; at most 7.5 minutes of the machine):
# GPU_RUN_STEPS="bundle gpu-host" runs just these. The bundle (`gpuproof sim bundle --without-dra -o FILE` where Go
# is, 47 MiB with the nodes' containerd, runc and CNI plugins, carried beside the repository) is installed into the
# build cache, so nothing is built here; then the gpu-host fleet (one kubelet node over this machine's driver and
# GPUs) runs the suite with the benchmarks, its records in gpu-host/.
BUNDLE=${GPU_RUN_BUNDLE:-gpuproof-bundle.tar.xz}
# what a kubelet node needs of this machine, said at once (a first GPU run learns every lack in one go): root,
# cgroup v1 (the type of /sys/fs/cgroup), capabilities, the tools, the driver gpu-host would use
step host-needs 30 sh -c "stat -fc 'cgroup fs: %T' /sys/fs/cgroup; grep -E '^Cap(Eff|Bnd)' /proc/self/status;
$PY -c 'from gpuproof.sim import gpuhost; from gpuproof.sim.kubelet import missing
print(missing() or \"kubelet nodes: nothing missing\"); print(gpuhost.refusal() or gpuhost.host_driver())'"
if [ -f "$BUNDLE" ]; then
    step bundle 90 $PY -m gpuproof sim install "$BUNDLE"
else
    step bundle 5 sh -c "echo 'no bundle at $BUNDLE (GPU_RUN_BUNDLE names it): gpu-host needs Go without one'; exit 1"
fi
step gpu-host "${GPU_RUN_GPU_HOST_S:-360}" $PY -m gpuproof run --fleet gpu-host --bench --report-dir "$REPORTS" \
    --run-id gpu-host
(cd "$REPORTS" 2>/dev/null && tar czf - gpu-* 2>/dev/null) >"$out/reports.tgz"
echo "=== $(date +%T) done" | tee -a "$log"
