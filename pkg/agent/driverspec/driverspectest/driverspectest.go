// Package driverspectest lays out a fake NVIDIA driver root for tests of
// the CDI edits: the libraries and binaries of a driver version, and device
// nodes that are real character devices (NVIDIA's generator keeps only
// those), made with mknod as root or, in a user namespace, by binding
// /dev/null over an empty file. Call it from a test binary run under
// internal/privatemount, so the bind mounts stay in its own namespace.
package driverspectest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Root makes a driver root for gpus GPUs of driver version (the version
// the NVML mock reports: the generator looks for its libraries by it).
func Root(t *testing.T, gpus int, version string) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []string{"libcuda.so.", "libnvidia-ml.so.", "libnvidia-ptxjitcompiler.so."} {
		write(t, filepath.Join(root, "usr/lib/x86_64-linux-gnu", f+version))
	}
	for _, f := range []string{"nvidia-smi", "nvidia-cuda-mps-control"} {
		write(t, filepath.Join(root, "usr/bin", f))
	}
	nodes := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	for i := range gpus {
		nodes = append(nodes, fmt.Sprintf("nvidia%d", i))
	}
	for _, n := range nodes {
		charDevice(t, filepath.Join(root, "dev", n))
	}
	return root
}

func write(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// charDevice makes path a character device (1:3, what /dev/null is).
func charDevice(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	if err == nil {
		return
	}
	write(t, path)
	if merr := unix.Mount("/dev/null", path, "", unix.MS_BIND, ""); merr != nil {
		t.Skipf("cannot make a character device for the fake driver root (mknod: %v; bind /dev/null: %v); run as root or where user namespaces are allowed", err, merr)
	}
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
}
