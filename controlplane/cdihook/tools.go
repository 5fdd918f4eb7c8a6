//go:build tools

// Package tools pins NVIDIA's nvidia-cdi-hook at the NVIDIA Container Toolkit release the pinned DRA driver
// requires: the CDI specs the driver writes run it as OCI hooks, and its image carries it at
// /usr/bin/nvidia-cdi-hook (as NVIDIA's image copies it from the toolkit's).
package tools

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
)
