// Command gpuproof-containerd is containerd v1.7 and its client ctr in one executable, as k3s ships them: the two
// share most of their packages, so a bundle carries them once (gpuproof/sim/bundle.py). It runs the program its
// name says (argv[0], a hard link named containerd or ctr), or the one its first argument names. The runc shim
// stays its own executable: it loads every plugin registered in its process, so it must not hold the daemon's.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/cmd/containerd/command"
	"github.com/containerd/containerd/cmd/ctr/app"
	"github.com/containerd/containerd/pkg/seed" //nolint:staticcheck // as containerd's and ctr's own mains

	_ "github.com/containerd/containerd/cmd/containerd/builtins"
)

type runner interface{ Run([]string) error }

var programs = map[string]func() runner{
	"containerd": func() runner { return command.App() },
	"ctr":        func() runner { return app.New() },
}

func main() {
	seed.WithTimeAndRand() //nolint:staticcheck // as containerd's and ctr's own mains
	args := os.Args
	name := filepath.Base(args[0])
	program, ok := programs[name]
	if !ok && len(args) > 1 {
		name = args[1]
		program, ok = programs[name]
		args = args[1:]
	}
	if !ok {
		fmt.Fprintln(os.Stderr, "gpuproof-containerd: run as (or with the first argument) containerd or ctr")
		os.Exit(2)
	}
	if err := program().Run(args); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s\n", name, err)
		os.Exit(1)
	}
}
