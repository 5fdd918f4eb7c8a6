//go:build tools

// Package tools pins CoreDNS, the cluster DNS of the embedded cluster's kubelet nodes (a Deployment in
// kube-system behind the kube-dns Service, as clusters run it).
package tools

import (
	_ "github.com/coredns/coredns"
)
