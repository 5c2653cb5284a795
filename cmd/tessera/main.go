// Command tessera is the operator's tool: `tessera sim` replays a GPU-sharing
// trace through Tessera's allocator and compares scoring policies; `tessera
// up` runs a local GPU cluster playground; `tessera top` shows who holds
// which GPU slice; `tessera gpus` reads the node's GPUs through NVML as the
// agent does.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/tessera-gpu/tessera/pkg/version"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed (bad trace, I/O)
	exitUsage = 2 // the command line is wrong
	// exitNoDriver (3, gpus.go): NVML could not be loaded.
)

const usage = `tessera — fine-grained GPU sharing for Kubernetes

Usage:
  tessera sim [flags]     replay a trace (or the built-in workload) through the allocator
  tessera up [flags]      a local GPU cluster in this process (--demo: with a sample workload)
  tessera top [flags]     who holds which GPU slice, per GPU, from a kubeconfig
  tessera gpus [flags]    read this node's GPUs through NVML as the agent does
  tessera version         print the version

Run 'tessera <command> -h' for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "sim":
		return runSim(args[1:], stdout, stderr)
	case "gpus":
		return runGPUs(args[1:], stdout, stderr)
	case "up":
		return runUp(args[1:], stdout, stderr)
	case "top":
		return runTop(args[1:], stdout, stderr)
	case "mps-control":
		// Not in the usage: the playground runs it as nvidia-cuda-mps-control.
		return runMPSControl(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, version.String("tessera"))
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "tessera: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}
