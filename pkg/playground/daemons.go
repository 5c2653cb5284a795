package playground

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MPSDaemons counts the MPS control daemons running for each of the node's
// GPUs, by UUID: the stand-in daemons (`tessera mps-control --serve`) whose
// environment names a pipe directory under the node's MPS root, found in
// /proc as an operator would find the real ones. One per GPU of an MPS-mode
// node is right; a second is a daemon the agent lost track of (a restart
// that did not end the one that stopped answering).
func (n *Node) MPSDaemons() (map[string]int, error) {
	return mpsDaemons("/proc", n.MPSRoot)
}

// mpsDaemons scans procRoot for daemons under root.
func mpsDaemons(procRoot, root string) (map[string]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	prefix := "CUDA_MPS_PIPE_DIRECTORY=" + filepath.Clean(root) + string(filepath.Separator)
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("\x00--serve")) {
			continue // gone meanwhile, not ours to read, or not a daemon
		}
		env, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if rest, ok := strings.CutPrefix(string(kv), prefix); ok {
				// <root>/<uuid>/pipe
				out[strings.SplitN(rest, string(filepath.Separator), 2)[0]]++
				break
			}
		}
	}
	return out, nil
}
