// Command tessera is the operator's tool: `tessera sim` replays a GPU-sharing
// trace through Tessera's allocator and compares scoring policies; `tessera
// up` runs a local GPU cluster playground; `tessera top` shows who holds
// which GPU slice; `tessera gpus` reads the node's GPUs through NVML as the
// agent does; `tessera doctor` finds what stands between a node or a
// cluster and working GPU sharing.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tessera-gpu/tessera/pkg/version"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed (bad trace, I/O)
	exitUsage = 2 // the command line is wrong
	// exitNoDriver (3, gpus.go): NVML could not be loaded.
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line and returns the exit code: the command's
// own, or exitUsage for a command line cobra refuses.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

// runContext is run until ctx ends as well as until Ctrl-C, for the
// commands that stay up (tessera up): a test ends them as a person's
// Ctrl-C would.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	code := exitOK
	root := newRootCmd(stdout, stderr, &code)
	root.SetArgs(args)
	if cmd, err := root.ExecuteContextC(ctx); err != nil {
		// The help of the command that refused, as kubectl points to it.
		fmt.Fprintf(stderr, "tessera: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return exitUsage
	}
	return code
}

func newRootCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	// Cobra merges pflag's process-wide flags into every command's; the
	// Kubernetes libraries linked in (the playground's API server) register
	// theirs there, a --version among them, none of them tessera's.
	pflag.CommandLine = pflag.NewFlagSet("tessera", pflag.ContinueOnError)
	root := &cobra.Command{
		Use:   "tessera",
		Short: "Fine-grained GPU sharing for Kubernetes",
		Long: `tessera is the operator's tool for Tessera, fine-grained GPU sharing for
Kubernetes: replay traces through the allocator (sim), run a local GPU
cluster (up), see who holds which GPU slice (top), read a node's GPUs as the
agent does (gpus), find what is wrong and what to do (doctor), run it long
under churn and faults with its invariants checked (soak).`,
		Version:       version.String("tessera"),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(
		newSimCmd(stdout, stderr, code),
		newUpCmd(stdout, stderr, code),
		newTopCmd(stdout, stderr, code),
		newGPUsCmd(stdout, stderr, code),
		newDoctorCmd(stdout, stderr, code),
		newSoakCmd(stdout, stderr, code),
		&cobra.Command{
			Use:   "version",
			Short: "Print the version",
			Args:  cobra.NoArgs,
			Run:   func(*cobra.Command, []string) { fmt.Fprintln(stdout, version.String("tessera")) },
		},
		// Not in the help: the playground runs it as nvidia-cuda-mps-control.
		&cobra.Command{
			Use:                "mps-control",
			Hidden:             true,
			DisableFlagParsing: true,
			Run:                func(_ *cobra.Command, args []string) { *code = runMPSControl(args, stdout, stderr) },
		},
	)
	return root
}
