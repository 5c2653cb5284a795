// Command tessera-scheduler is kube-scheduler with Tessera's TesseraGPU
// plugin compiled in. It takes every kube-scheduler flag; enable the plugin
// in a profile of the --config file (see deploy/scheduler-config.yaml).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/tessera-gpu/tessera/pkg/scheduler"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand(scheduler.Register)))
}
