#!/usr/bin/env bash
# Makes the kind cluster of gpu-nvkind.yaml a real-GPU cluster, the way nvkind does: in every worker
# that got GPUs (a /dev/null mount at /var/run/nvidia-container-devices/...) it installs the NVIDIA
# container toolkit, makes nvidia containerd's default runtime and unmasks /proc/driver/nvidia; then
# NVIDIA's device plugin and GPU Feature Discovery (Helm chart nvidia-device-plugin, with NFD).
#
# gpuproof runs it after pytest-kubernetes created the cluster, with KUBECONFIG and KIND_CLUSTER_NAME
# set; by hand: KIND_CLUSTER_NAME=gpuproof-gpu KUBECONFIG=... bash kind-configs/gpu-nvkind.setup.sh
# Host: NVIDIA driver; Docker with the NVIDIA container toolkit as default runtime
# (`sudo nvidia-ctk runtime configure --runtime=docker --set-as-default --cdi.enabled`) and
# `sudo nvidia-ctk config --set accept-nvidia-visible-devices-as-volume-mounts=true --in-place`,
# then a Docker restart. Needs docker, kind, helm, kubectl.
set -euo pipefail

die() { echo "gpu-nvkind.setup.sh: $*" >&2; exit 1; }
[ -n "${KIND_CLUSTER_NAME:-}" ] || die "KIND_CLUSTER_NAME is not set (the kind cluster to set up)"
[ -n "${KUBECONFIG:-}" ] || die "KUBECONFIG is not set (the kind cluster's kubeconfig)"
for cmd in docker kind helm kubectl; do
  command -v "$cmd" >/dev/null 2>&1 || die "needs \`$cmd\` on PATH"
done
DEVICE_PLUGIN_VERSION=0.19.3          # the version controlplane/nvidia pins

runtime=$(docker info --format '{{.DefaultRuntime}}')
[ "$runtime" = nvidia ] || die "Docker's default runtime is '$runtime', not nvidia: run \`sudo nvidia-ctk runtime configure --runtime=docker --set-as-default --cdi.enabled\` and restart Docker"
grep -Eq '^[[:space:]]*accept-nvidia-visible-devices-as-volume-mounts[[:space:]]*=[[:space:]]*true' \
  /etc/nvidia-container-runtime/config.toml 2>/dev/null \
  || die "the toolkit does not take GPUs from volume mounts: run \`sudo nvidia-ctk config --set accept-nvidia-visible-devices-as-volume-mounts=true --in-place\` and restart Docker"

gpu_nodes=()
for node in $(kind get nodes --name "$KIND_CLUSTER_NAME"); do
  if docker exec "$node" sh -c 'ls /var/run/nvidia-container-devices/ >/dev/null 2>&1'; then
    gpu_nodes+=("$node")
  fi
done
[ "${#gpu_nodes[@]}" -gt 0 ] || die "no node of $KIND_CLUSTER_NAME has /var/run/nvidia-container-devices (see kind-configs/gpu-nvkind.yaml)"

for node in "${gpu_nodes[@]}"; do
  echo "[nvkind] $node: NVIDIA container toolkit, containerd runtime, /proc/driver/nvidia"
  docker exec "$node" bash -euc '
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq gpg curl >/dev/null
    curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \
      | gpg --dearmor --yes -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \
      | sed "s#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#" \
      > /etc/apt/sources.list.d/nvidia-container-toolkit.list
    apt-get update -qq && apt-get install -y -qq nvidia-container-toolkit >/dev/null
    nvidia-ctk runtime configure --runtime=containerd --set-as-default
    systemctl restart containerd
    umount -R /proc/driver/nvidia 2>/dev/null || true
    nvidia-smi -L'
  kubectl label node "$node" nvidia.com/gpu.present=true --overwrite
done

echo "[nvkind] installing nvidia-device-plugin $DEVICE_PLUGIN_VERSION with GFD"
helm upgrade --install nvdp nvidia-device-plugin --repo https://nvidia.github.io/k8s-device-plugin \
  --version "$DEVICE_PLUGIN_VERSION" --namespace nvidia-device-plugin --create-namespace \
  --set gfd.enabled=true --wait --timeout 600s
kubectl wait node -l nvidia.com/gpu.present=true --for=jsonpath='{.status.allocatable.nvidia\.com/gpu}' --timeout=300s
kubectl wait node -l nvidia.com/gpu.present=true --for=jsonpath='{.metadata.labels.nvidia\.com/gpu\.product}' --timeout=300s
echo "[nvkind] ready:"
kubectl get nodes -l nvidia.com/gpu.present=true -L nvidia.com/gpu.product,nvidia.com/gpu.count
