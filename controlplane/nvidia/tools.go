//go:build tools

// Package tools pins the NVIDIA node-side components that gpuproof's kubelet
// backend builds: the device plugin and GPU Feature Discovery. The blank imports
// keep them (and their dependencies) in go.mod/go.sum; the build tag keeps this
// file out of every normal build. Build a binary with, from this folder:
//
//	go build -trimpath -buildvcs=false -o OUT/ github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin
//	go build -trimpath -buildvcs=false -o OUT/ github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery
//
// See docs/kubelet-backend.md.
package tools

import (
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/gpu-feature-discovery"
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin"
)
