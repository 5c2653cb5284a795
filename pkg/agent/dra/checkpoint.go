package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
)

// checkpointVersion is the layout of the checkpoint file; a file of
// another version is refused rather than misread.
const checkpointVersion = 1

// checkpointFile is the file, in the driver's state directory, that holds
// every claim the driver has started to prepare and not unprepared.
const checkpointFile = "claims.json"

// claimState is how far a claim got.
type claimState string

const (
	// statePreparing: recorded before any file of the claim is written,
	// so that an Unprepare after a crash removes whatever was.
	statePreparing claimState = "preparing"
	// statePrepared: every file written; Prepare answers from the record.
	statePrepared claimState = "prepared"
)

// preparedClaim is what the driver keeps of a claim: enough to answer a
// repeated Prepare and to undo it after a restart, when the claim itself
// may be gone.
type preparedClaim struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	State     claimState `json:"state"`
	// Devices are the claim's allocated devices of this driver, in the
	// allocation's order: what the repeated Prepare answers, and what a
	// changed allocation is told from.
	Devices []allocatedDevice `json:"devices"`
	// CDIDevice is the fully qualified CDI device the claim's containers
	// get (kind=name).
	CDIDevice string `json:"cdiDevice"`
	// Shim: the claim's libtessera directory was (or was being) written.
	Shim bool `json:"shim,omitempty"`
	// Pod is the one pod the claim was reserved for when it was prepared,
	// whose cgroup holds its kernel memory limits; empty for a claim
	// shared by several pods (and in checkpoints written before it was
	// recorded: those claims keep no kernel limit).
	Pod types.UID `json:"pod,omitempty"`
	// PodName and Containers are that pod's name and the containers given
	// the claim, where the agent knew the pod: what the pod's GPUIsolation
	// condition and the slice series name.
	PodName    string   `json:"podName,omitempty"`
	Containers []string `json:"containers,omitempty"`
}

// allocatedDevice is one result of a claim's allocation.
type allocatedDevice struct {
	Request string `json:"request"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	ShareID string `json:"shareID,omitempty"`
	// MemoryMiB and Cores are the capacity the claim consumed.
	MemoryMiB int64 `json:"memoryMiB"`
	Cores     int64 `json:"cores"`
}

type checkpoint struct {
	Version int                          `json:"version"`
	Claims  map[types.UID]*preparedClaim `json:"claims"`
}

// loadCheckpoint reads the state directory's checkpoint; none yet is an
// empty one.
func loadCheckpoint(dir string) (map[types.UID]*preparedClaim, error) {
	path := filepath.Join(dir, checkpointFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[types.UID]*preparedClaim{}, nil
	}
	if err != nil {
		return nil, err
	}
	var c checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("DRA checkpoint %s is not valid JSON (%v): move it aside only once no pod on this node holds a gpu.tessera.dev claim, or their claims cannot be unprepared", path, err)
	}
	if c.Version != checkpointVersion {
		return nil, fmt.Errorf("DRA checkpoint %s has version %d, this agent reads %d: run the agent version that wrote it, or drain the node's claims first", path, c.Version, checkpointVersion)
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]*preparedClaim{}
	}
	return c.Claims, nil
}

// saveCheckpoint replaces the checkpoint atomically, synced, so that a
// crash leaves the old file or the new, never a torn one.
func saveCheckpoint(dir string, claims map[types.UID]*preparedClaim) error {
	b, err := json.MarshalIndent(checkpoint{Version: checkpointVersion, Claims: claims}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(dir, checkpointFile)
	tmp, err := os.CreateTemp(dir, checkpointFile+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
