#!/bin/sh
# Builds the NVIDIA node-side binaries pinned in this module (device plugin, GFD) into OUT
# (default /tmp/nv). Their NVML backend must be NVIDIA's mock NVML, which the module proxy
# does not serve: see docs/kubelet-backend.md.
#   ./build.sh [OUT]
set -eu
cd "$(dirname "$0")"
OUT=${1:-/tmp/nv}
mkdir -p "$OUT/bin"
DP=github.com/NVIDIA/k8s-device-plugin
VERSION=$(go list -m -f '{{.Version}}' $DP)
LDFLAGS="-s -w -X $DP/internal/info.version=$VERSION"
# go-nvml dlopen()s libnvidia-ml.so.1 through cgo: CGO_ENABLED=1 and a C compiler are required.
export CGO_ENABLED=1
for cmd in nvidia-device-plugin gpu-feature-discovery; do
	go build -trimpath -buildvcs=false -ldflags "$LDFLAGS" -o "$OUT/bin/" $DP/cmd/$cmd
done
