//go:build tools

// Package tools pins node-feature-discovery's nfd-master, which turns GFD's NodeFeature objects into
// node labels on the embedded cluster's kubelet nodes.
package tools

import (
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-master"
)
