#!/usr/bin/env bash
# Makes the kind cluster of gpu-mock.yaml a fake-GPU cluster with NVIDIA's GPU mock
# (github.com/NVIDIA/k8s-test-infra, deployments/gpu-mock), then NVIDIA's device plugin and GPU
# Feature Discovery (Helm chart nvidia-device-plugin, with NFD) reading the mock's NVML.
#
# gpuproof runs it after pytest-kubernetes created the cluster, with KUBECONFIG and KIND_CLUSTER_NAME
# set; by hand: KIND_CLUSTER_NAME=gpuproof-gpu-mock KUBECONFIG=... bash kind-configs/gpu-mock.setup.sh
# Needs git, docker, kind, helm, kubectl, and network access to github.com, nvcr.io and the Helm repos.
#   GPU_MOCK_REF   k8s-test-infra commit to build the mock from (default: the one this was written for)
#   GPU_MOCK_SRC   an existing k8s-test-infra checkout to use instead of cloning
set -euo pipefail

die() { echo "gpu-mock.setup.sh: $*" >&2; exit 1; }
[ -n "${KIND_CLUSTER_NAME:-}" ] || die "KIND_CLUSTER_NAME is not set (the kind cluster to set up)"
[ -n "${KUBECONFIG:-}" ] || die "KUBECONFIG is not set (the kind cluster's kubeconfig)"
for cmd in git docker kind helm kubectl; do
  command -v "$cmd" >/dev/null 2>&1 || die "needs \`$cmd\` on PATH"
done

DEVICE_PLUGIN_VERSION=0.19.3          # the version controlplane/nvidia pins
ref=${GPU_MOCK_REF:-1db3ed0610d6d45159bbe1501b3648248337eb3f}
src=${GPU_MOCK_SRC:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuproof/k8s-test-infra}
if [ -z "${GPU_MOCK_SRC:-}" ]; then
  [ -d "$src/.git" ] || git clone --quiet https://github.com/NVIDIA/k8s-test-infra "$src"
  git -C "$src" fetch --quiet origin
  git -C "$src" checkout --quiet --detach "$ref"
fi
[ -f "$src/deployments/gpu-mock/Dockerfile" ] || die "$src has no deployments/gpu-mock (wrong checkout or ref?)"

# 1. the mock's image (NVIDIA publishes none yet), loaded into the kind nodes
tag=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null || echo local)
echo "[gpu-mock] building gpu-mock:$tag from $src"
docker build --quiet -t "gpu-mock:$tag" -f "$src/deployments/gpu-mock/Dockerfile" "$src" >/dev/null
kind load docker-image "gpu-mock:$tag" --name "$KIND_CLUSTER_NAME"

# 2. one gpu-mock release per (profile, count) that the workers' labels ask for
pairs=$(kubectl get nodes -l gpu-mock/profile -o go-template \
  --template '{{range .items}}{{index .metadata.labels "gpu-mock/profile"}} {{index .metadata.labels "gpu-mock/count"}}{{"\n"}}{{end}}' | sort -u)
[ -n "$pairs" ] || die "no node carries a gpu-mock/profile label (see kind-configs/gpu-mock.yaml)"
while read -r profile count; do
  [ -n "$profile" ] || continue
  echo "[gpu-mock] installing gpu-mock-$profile (${count:-8} GPUs per node)"
  helm upgrade --install "gpu-mock-$profile" "$src/deployments/gpu-mock/helm/gpu-mock" \
    --set image.repository=gpu-mock --set "image.tag=$tag" --set image.pullPolicy=Never \
    --set "gpu.profile=$profile" --set "gpu.count=${count:-8}" \
    --set-string "nodeSelector.gpu-mock/profile=$profile" --wait --timeout 300s
done <<< "$pairs"

# 3. NVIDIA's device plugin + GFD (+ NFD, which turns GFD's features into labels) on the mock driver root
echo "[gpu-mock] installing nvidia-device-plugin $DEVICE_PLUGIN_VERSION with GFD"
helm upgrade --install nvdp nvidia-device-plugin --repo https://nvidia.github.io/k8s-device-plugin \
  --version "$DEVICE_PLUGIN_VERSION" --namespace nvidia-device-plugin --create-namespace \
  --set gfd.enabled=true --set nvidiaDriverRoot=/var/lib/nvidia-mock/driver \
  --set deviceDiscoveryStrategy=nvml --wait --timeout 600s

# 4. done when every mock node advertises nvidia.com/gpu and carries GFD's product label
kubectl wait node -l gpu-mock/profile --for=jsonpath='{.metadata.labels.nvidia\.com/gpu\.present}'=true --timeout=300s
kubectl wait node -l gpu-mock/profile --for=jsonpath='{.status.allocatable.nvidia\.com/gpu}' --timeout=300s
kubectl wait node -l gpu-mock/profile --for=jsonpath='{.metadata.labels.nvidia\.com/gpu\.product}' --timeout=300s
echo "[gpu-mock] ready:"
kubectl get nodes -l gpu-mock/profile -L nvidia.com/gpu.product,nvidia.com/gpu.count
