// Command tessera-scheduler is kube-scheduler with Tessera's TesseraGPU
// plugin compiled in. It takes every kube-scheduler flag; enable the plugin
// in a profile of the --config file (see deploy/scheduler-config.yaml).
package main

import (
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	preemptioncontroller "github.com/tessera-gpu/tessera/pkg/preemption/controller"
	"github.com/tessera-gpu/tessera/pkg/scheduler"
	"github.com/tessera-gpu/tessera/pkg/version"
)

func main() {
	// kube-scheduler's own --version reports the Kubernetes release its
	// library was stamped with; an operator asking this binary wants Tessera's,
	// and the kube-scheduler inside.
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Printf("%s, kube-scheduler %s\n", version.String("tessera-scheduler"), version.Dependency("k8s.io/kubernetes"))
		os.Exit(0)
	}
	os.Exit(cli.Run(app.NewSchedulerCommand(scheduler.RegisterWith(preemptioncontroller.Start))))
}
