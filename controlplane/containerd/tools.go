//go:build tools

// Package tools pins containerd 1.7, the runtime of the embedded cluster's DRA kubelet nodes: its CRI
// plugin injects the CDI devices the kubelet names (CRI CDIDevices), which Debian's containerd 1.6 ignores.
package tools

import (
	_ "github.com/containerd/containerd/cmd/containerd"
	_ "github.com/containerd/containerd/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/cmd/ctr"
)
