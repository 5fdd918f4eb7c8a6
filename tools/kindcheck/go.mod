// kindcheck: loads and validates kind cluster configs with kind's own code (the parser, defaulting
// and Validate that `kind create cluster` runs before it starts any container), without Docker.
//
// The module path sits under sigs.k8s.io/kind/pkg on purpose: Go lets a package import
// .../pkg/internal/... only from import paths under .../pkg, and kind keeps its config loader and
// validation in sigs.k8s.io/kind/pkg/internal/apis/config. This module is gpuproof's, not kind's;
// nothing imports it, and it is built only into gpuproof's tool cache (gpuproof/tools.py).
module sigs.k8s.io/kind/pkg/gpuproof/kindcheck

go 1.22

require sigs.k8s.io/kind v0.33.0

require (
	github.com/BurntSushi/toml v1.4.0 // indirect
	github.com/evanphx/json-patch/v5 v5.6.0 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	sigs.k8s.io/yaml v1.4.0 // indirect
)
