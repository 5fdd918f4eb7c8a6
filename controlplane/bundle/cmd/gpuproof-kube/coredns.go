package main

// CoreDNS v1.14.7 (coredns.go: coremain.Run) with the plugins the cluster's Corefile uses (Kubernetes' addon
// manifest: errors, health, ready, kubernetes, prometheus, cache, reload, loadbalance; forward and loop are
// taken out of it, see gpuproof/sim/clusternet.py), as CoreDNS's plugin.cfg lets a build choose them.

import (
	"os"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func corednsMain(args []string) int {
	os.Args = args
	coremain.Run()
	return 0
}
