//go:build tools

// Package tools pins the platform's operators that the embedded cluster runs for fleets that name them
// (gpuproof/sim/platform.py): Kueue's and Kubeflow Trainer's controller managers, and kustomize, which renders
// their install manifests from the modules' own kustomizations as `kubectl apply -k` would.
package tools

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/kueue/cmd/kueue"
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
