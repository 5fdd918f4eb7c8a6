// Command gpuproof-kube is one executable for the Kubernetes-side programs of gpuproof's embedded cluster, as
// hyperkube (Kubernetes up to 1.17) and k3s are: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// kubelet and kube-proxy (Kubernetes v1.35.4, etcd v3.6.5: the upstream commands' own constructors), NFD's
// nfd-master v0.19.0 and kwok v0.7.0 (their mains, copied) and CoreDNS v1.14.7 with the plugins the cluster's
// Corefile uses, sharing the packages they have in common once. gpuproof's bundle (gpuproof/sim/bundle.py) ships it, so that a machine
// without Go runs the embedded cluster. Built with CGO_ENABLED=0: static, so it runs in CoreDNS's image too.
//
// go.mod: controlplane/kube's pins, raised where nfd-master and CoreDNS ask more (gRPC 1.83.0, Prometheus' client
// 1.24.1, ...), with etcd's api and client kept at etcd's own v3.6.5 and opencontainers' cgroups and runtime-spec
// at the kubelet's (v0.0.3, v1.2.1: the kubelet v1.35.4 does not build with cgroups v0.0.6). kwok v0.7.0 is one of
// them too (kwok.go), built from a copy of its module with one name replaced (it reads an annotation key that
// apimachinery v0.35 no longer declares; its next release, v0.8.0, needs Kubernetes v0.36).
//
// It runs the program its name says (argv[0], a hard link named after the program), or the one its first
// argument names: `gpuproof-kube kube-apiserver --help`.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	_ "time/tzdata" // for timeZone support in CronJob (kube-apiserver, kube-controller-manager)

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func kube(command func() *cobra.Command) func([]string) int {
	return func(args []string) int {
		cmd := command()
		cmd.SetArgs(args[1:])
		return cli.Run(cmd)
	}
}

var components = map[string]func([]string) int{
	"etcd": func(args []string) int {
		etcdmain.Main(args)
		return 0
	},
	"kube-apiserver":          kube(apiserver.NewAPIServerCommand),
	"kube-controller-manager": kube(controllermanager.NewControllerManagerCommand),
	"kube-scheduler": kube(func() *cobra.Command {
		return scheduler.NewSchedulerCommand()
	}),
	"kubelet": kube(func() *cobra.Command {
		return kubelet.NewKubeletCommand(context.Background())
	}),
	"kube-proxy": kube(proxy.NewProxyCommand),
	"nfd-master": nfdMasterMain,
	"coredns":    corednsMain,
	"kwok":       kwokMain,
}

func main() {
	args := os.Args
	run, ok := components[filepath.Base(args[0])]
	if !ok && len(args) > 1 {
		run, ok = components[args[1]]
		args = args[1:]
	}
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "gpuproof-kube: run as (or with the first argument) one of: %s\n",
			strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(run(args))
}
