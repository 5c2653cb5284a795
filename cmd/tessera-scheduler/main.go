// Command tessera-scheduler is kube-scheduler with Tessera's TesseraGPU
// plugin compiled in. It takes every kube-scheduler flag; enable the plugin
// in a profile of the --config file (see deploy/scheduler-config.yaml).
// --claim-admission-port (and its siblings) serve the webhook that refuses
// pods naming another scheduler with a gpu.tessera.dev claim
// (pkg/claimadmission).
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/tessera-gpu/tessera/pkg/claimadmission"
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
	os.Exit(cli.Run(newCommand()))
}

// newCommand is kube-scheduler's command with Tessera's plugins, and the
// claim admission webhook, which runs in the scheduler with its client
// when --claim-admission-port is given.
func newCommand() *cobra.Command {
	var admission claimadmission.Options
	cmd := app.NewSchedulerCommand(scheduler.RegisterWith(preemptioncontroller.Start, admission.Start))
	fs := pflag.NewFlagSet("Tessera", pflag.ContinueOnError)
	admission.AddFlags(fs)
	cmd.Flags().AddFlagSet(fs)
	// kube-scheduler's help and usage list its own flag sections only.
	help, usage := cmd.HelpFunc(), cmd.UsageFunc()
	tessera := func(c *cobra.Command) {
		fmt.Fprintf(c.OutOrStdout(), "\nTessera flags:\n\n%s", fs.FlagUsagesWrapped(100))
	}
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) { help(c, args); tessera(c) })
	cmd.SetUsageFunc(func(c *cobra.Command) error { err := usage(c); tessera(c); return err })
	return cmd
}
