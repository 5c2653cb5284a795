// Command fakecontrol stands in for nvidia-cuda-mps-control in the MPS
// tests, where no NVIDIA driver is present; see package mpssim.
package main

import (
	"os"

	"github.com/tessera-gpu/tessera/pkg/agent/mps/mpssim"
)

func main() {
	os.Exit(mpssim.Main(os.Args[:1], os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
