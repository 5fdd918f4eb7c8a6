// Command kindcheck checks kind cluster config files the way `kind create cluster --config` does
// before it touches Docker: kind's strict YAML decoding of the v1alpha4 API, its defaulting, its
// conversion to the internal config and its Validate(), plus merging the containerd config patches
// with kind's own TOML patcher. It needs no container engine, so gpuproof's tests can run it on
// machines where kind itself cannot create a cluster.
//
//	kindcheck [-json] [-name NAME] FILE...
//
// One line per file that fails ("FILE: what is wrong"), exit status 1 if any failed, 2 on bad usage.
// With -json, every file that passes is printed as one JSON object per line (name, nodes with their
// roles, images, labels and mounts, feature gates, runtime config), so callers can check what kind
// would build.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/kind/pkg/internal/apis/config"
	"sigs.k8s.io/kind/pkg/internal/apis/config/encoding"
	"sigs.k8s.io/kind/pkg/internal/patch"
)

type mount struct {
	HostPath      string `json:"hostPath"`
	ContainerPath string `json:"containerPath"`
	ReadOnly      bool   `json:"readOnly"`
}

type node struct {
	Role        string            `json:"role"`
	Image       string            `json:"image"`
	Labels      map[string]string `json:"labels"`
	ExtraMounts []mount           `json:"extraMounts"`
}

type summary struct {
	File                    string            `json:"file"`
	Name                    string            `json:"name"`
	Nodes                   []node            `json:"nodes"`
	FeatureGates            map[string]bool   `json:"featureGates"`
	RuntimeConfig           map[string]string `json:"runtimeConfig"`
	ContainerdConfigPatches int               `json:"containerdConfigPatches"`
	KubeadmConfigPatches    int               `json:"kubeadmConfigPatches"`
}

// A stand-in for the containerd config inside a kind node image: kind merges the patches into the
// node's real file at creation; merging them here proves they parse and apply as TOML.
const containerdBase = "version = 2\n\n[plugins]\n"

func check(path, name string) (*summary, error) {
	cfg, err := encoding.Load(path)
	if err != nil {
		return nil, err
	}
	// as kind create cluster: --name (or $KIND_CLUSTER_NAME) wins over the file, then defaults fill in
	if name != "" {
		cfg.Name = name
	}
	config.SetDefaultsCluster(cfg)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid: %v", err)
	}
	if len(cfg.ContainerdConfigPatches)+len(cfg.ContainerdConfigPatchesJSON6902) > 0 {
		if _, err := patch.ContainerdTOML(containerdBase, cfg.ContainerdConfigPatches,
			cfg.ContainerdConfigPatchesJSON6902); err != nil {
			return nil, fmt.Errorf("containerdConfigPatches do not apply: %v", err)
		}
	}
	return describe(path, cfg), nil
}

func describe(path string, cfg *config.Cluster) *summary {
	s := &summary{File: path, Name: cfg.Name, FeatureGates: cfg.FeatureGates, RuntimeConfig: cfg.RuntimeConfig,
		ContainerdConfigPatches: len(cfg.ContainerdConfigPatches) + len(cfg.ContainerdConfigPatchesJSON6902),
		KubeadmConfigPatches:    len(cfg.KubeadmConfigPatches) + len(cfg.KubeadmConfigPatchesJSON6902)}
	for _, n := range cfg.Nodes {
		out := node{Role: string(n.Role), Image: n.Image, Labels: n.Labels, ExtraMounts: []mount{}}
		for _, m := range n.ExtraMounts {
			out.ExtraMounts = append(out.ExtraMounts, mount{m.HostPath, m.ContainerPath, m.Readonly})
		}
		s.Nodes = append(s.Nodes, out)
	}
	return s
}

func main() {
	asJSON := flag.Bool("json", false, "print each valid config as one JSON line")
	name := flag.String("name", os.Getenv("KIND_CLUSTER_NAME"), "cluster name, as kind create cluster --name")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: kindcheck [-json] [-name NAME] FILE...")
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	failed := false
	enc := json.NewEncoder(os.Stdout)
	for _, path := range flag.Args() {
		s, err := check(path, *name)
		if err != nil {
			failed = true
			// kind's aggregate errors span lines: one line per file keeps the report readable
			fmt.Fprintf(os.Stderr, "%s: %s\n", path, strings.Join(strings.Fields(err.Error()), " "))
			continue
		}
		if *asJSON {
			_ = enc.Encode(s)
		}
	}
	if failed {
		os.Exit(1)
	}
}
