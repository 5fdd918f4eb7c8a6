/*
Copyright 2022 The Kubernetes Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Copied from kwok v0.7.0 cmd/kwok/main.go: its main as kwokMain (a main package cannot be imported). kwok v0.7.0
// is built from a copy of its module in which one name is replaced by its value: pkg/utils/informer reads the
// annotation metav1.InitialEventsListBlueprintAnnotationKey, which apimachinery v0.35 no longer declares
// (gpuproof/sim/bundle.py, kwok_source).
package main

import (
	"os"

	"github.com/spf13/pflag"

	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/kwok/cmd"
	"sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

func kwokMain(args []string) int {
	os.Args = args
	// cobra merges pflag.CommandLine into every command, and here it holds Kubernetes' --version (verflag: a flag of
	// its own type, linked in by the other programs), which kwok's bool --version cannot read: kwok gets the
	// global flags without it, as in its own executable, where verflag is not linked
	global := pflag.NewFlagSet(args[0], pflag.ExitOnError)
	pflag.CommandLine.VisitAll(func(f *pflag.Flag) {
		if f.Name != "version" {
			global.AddFlag(f)
		}
	})
	pflag.CommandLine = global

	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsWhitelist.UnknownFlags = true
	flagset.Usage = func() {}

	ctx := signals.SetupSignalContext()
	ctx, logger := log.InitFlags(ctx, flagset)

	ctx, err := config.InitFlags(ctx, flagset)
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flagset.FlagUsages()))
		logger.Error("Init config flags", err)
		return 1
	}

	command := cmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flagset)
	err = command.ExecuteContext(ctx)
	if err != nil {
		logger.Error("Execute exit", err)
		return 1
	}
	return 0
}
