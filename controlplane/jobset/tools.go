//go:build tools

// Package tools pins JobSet's controller manager, which the embedded cluster runs for fleets that name it
// (gpuproof/sim/platform.py); Kubeflow Trainer turns each TrainJob into a JobSet.
package tools

import (
	_ "sigs.k8s.io/jobset"
)
