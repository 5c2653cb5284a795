package playground

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestMPSDaemonsCountsOnlyTheNodesDaemons: daemons are found by the pipe
// directory in their environment, under this node's MPS root only; clients
// (no --serve), other nodes' daemons and unreadable entries do not count.
func TestMPSDaemonsCountsOnlyTheNodesDaemons(t *testing.T) {
	proc := t.TempDir()
	root := "/tmp/pg/gpu-node-0/mps"
	write := func(pid int, cmdline, env string) {
		dir := filepath.Join(proc, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if cmdline != "" {
			if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(cmdline), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(env), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	daemon := "/bin/tessera\x00mps-control\x00--serve\x00"
	write(10, daemon, "HOME=/\x00CUDA_MPS_PIPE_DIRECTORY="+root+"/GPU-a/pipe\x00")
	write(11, daemon, "CUDA_MPS_PIPE_DIRECTORY="+root+"/GPU-a/pipe\x00") // a second for GPU-a
	write(12, daemon, "CUDA_MPS_PIPE_DIRECTORY="+root+"/GPU-b/pipe\x00")
	write(13, "/bin/tessera\x00mps-control\x00", "CUDA_MPS_PIPE_DIRECTORY="+root+"/GPU-b/pipe\x00") // a client
	write(14, daemon, "CUDA_MPS_PIPE_DIRECTORY=/tmp/pg/gpu-node-1/mps/GPU-c/pipe\x00")              // another node
	write(15, "", "")                                                                               // a zombie
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := mpsDaemons(proc, root)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "map[GPU-a:2 GPU-b:1]" {
		t.Fatalf("daemons %v, want map[GPU-a:2 GPU-b:1]", got)
	}
}
