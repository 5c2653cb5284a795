// Package shim puts libtessera, the preload library that holds a slice
// nothing stronger holds (libtessera/README.md), into a container: the
// limits file it reads, per container, and the CDI mounts that make the
// dynamic loader preload it from a read-only /etc/ld.so.preload. Limits is
// the pure part; a Dir does the file work under the agent's --shim-dir. It
// must not decide which slices need the library: gpu.GuaranteeOf does.
package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tessera-gpu/tessera/pkg/agent/tenantdir"
	"github.com/tessera-gpu/tessera/pkg/gpu"
)

// Where the library finds what it needs inside the container: fixed in
// the library when it is built (libtessera/src/libtessera.h).
const (
	LibraryInContainer = "/usr/lib/tessera/libtessera.so"
	PreloadInContainer = "/etc/ld.so.preload"
	LimitsInContainer  = "/etc/tessera/limits"
	RunDirInContainer  = "/run/tessera"
)

// DefaultLibrary is where the agent's image has the library.
const DefaultLibrary = "/usr/lib/tessera/libtessera.so"

// Limits is the limits file of a container: one line per GPU of its
// assignment, "<UUID> <memory bytes> <cores percent>", with "mps" for an
// MPS client (the library then counts its memory and leaves compute to
// MPS). Every GPU is listed: the library refuses a GPU it finds no line
// for.
func Limits(c gpu.ContainerAssignment) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# libtessera limits of container %s, written by tessera-agent\n", c.Name)
	for _, g := range c.GPUs {
		fmt.Fprintf(&b, "%s %d %d", g.UUID, g.MemoryMiB<<20, g.CoresPercent())
		if c.Mode == gpu.ModeMPS {
			b.WriteString(" mps")
		}
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// Mount is a bind mount of a host path into the container.
type Mount struct {
	HostPath, ContainerPath string
	ReadOnly                bool
}

// Dir is the agent's shim directory on the host: the library, the
// ld.so.preload file naming it, and a directory per pod and container
// (limits, and the usage region the container's processes share).
type Dir struct {
	root string
}

// ErrNoLibrary: the library is not where the agent was told it is.
var ErrNoLibrary = errors.New("libtessera not found")

// Install makes root the shim directory, with the library copied from
// library (the runtime bind-mounts host paths, and the agent's own image is
// not one) and the ld.so.preload file. It is safe to run again: each file
// is replaced whole (tenantdir.WriteFile), so a container starting
// meanwhile sees the old or the new one.
func Install(root, library string) (*Dir, error) {
	lib, err := os.ReadFile(library)
	if err != nil {
		return nil, fmt.Errorf("%w at %s (--shim-library): %v", ErrNoLibrary, library, err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	if err := tenantdir.WriteFile(root, "libtessera.so", lib, 0o755); err != nil {
		return nil, fmt.Errorf("copying libtessera: %w", err)
	}
	if err := tenantdir.WriteFile(root, "ld.so.preload", []byte(LibraryInContainer+"\n"), 0o644); err != nil {
		return nil, err
	}
	return &Dir{root: root}, nil
}

func (d *Dir) libraryPath() string { return filepath.Join(d.root, "libtessera.so") }

// containerDir is a container's directory; pod UIDs and container names
// are DNS labels, so neither can climb out of root.
func (d *Dir) containerDir(podUID, container string) string {
	return filepath.Join(d.root, "pods", podUID, container)
}

// Prepare writes a container's limits and a fresh usage directory, and
// returns its mounts: the library, ld.so.preload and the limits read-only,
// the usage directory read-write.
func (d *Dir) Prepare(podUID, container string, limits []byte) ([]Mount, error) {
	if !plainName(podUID) || !plainName(container) {
		return nil, fmt.Errorf("shim: pod UID %q and container %q must be plain names", podUID, container)
	}
	return d.prepareIn(d.containerDir(podUID, container), limits)
}

// claimDir is a DRA claim's directory: every container of every pod that
// shares the claim is one tenant, with one count. Claims live apart from
// pods, so Collect (which follows pods) never removes a prepared claim's.
func (d *Dir) claimDir(claimUID string) string {
	return filepath.Join(d.root, "claims", claimUID)
}

// PrepareClaim is Prepare for a DRA claim (pkg/agent/dra), keyed by its
// UID: the claim is prepared once, and every container given it shares its
// limits and its usage region.
func (d *Dir) PrepareClaim(claimUID string, limits []byte) ([]Mount, error) {
	if !plainName(claimUID) {
		return nil, fmt.Errorf("shim: claim UID %q must be a plain name", claimUID)
	}
	return d.prepareIn(d.claimDir(claimUID), limits)
}

// ReleaseClaim removes a claim's directory (its limits and usage region);
// removing one that is not there is no error.
func (d *Dir) ReleaseClaim(claimUID string) error {
	if !plainName(claimUID) {
		return fmt.Errorf("shim: claim UID %q must be a plain name", claimUID)
	}
	return os.RemoveAll(d.claimDir(claimUID))
}

func plainName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsAny(s, "/\\")
}

func (d *Dir) prepareIn(dir string, limits []byte) ([]Mount, error) {
	run := filepath.Join(dir, "run")
	// A restarted container starts with a fresh count: its processes
	// before are gone, and so is what the driver gave them.
	if err := os.RemoveAll(run); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(run, 0o777); err != nil {
		return nil, err
	}
	// The container's user may not be root: the region is created by
	// its first process.
	if err := os.Chmod(run, 0o777); err != nil {
		return nil, err
	}
	if err := tenantdir.WriteFile(dir, "limits", limits, 0o644); err != nil {
		return nil, fmt.Errorf("shim: limits in %s: %w", dir, err)
	}
	path := filepath.Join(dir, "limits")
	return []Mount{
		{HostPath: d.libraryPath(), ContainerPath: LibraryInContainer, ReadOnly: true},
		{HostPath: filepath.Join(d.root, "ld.so.preload"), ContainerPath: PreloadInContainer, ReadOnly: true},
		{HostPath: path, ContainerPath: LimitsInContainer, ReadOnly: true},
		{HostPath: run, ContainerPath: RunDirInContainer},
	}, nil
}

// Collect removes the directories of pods keep does not name (ended or
// deleted pods); it returns how many.
func (d *Dir) Collect(keep func(podUID string) bool) (int, error) {
	entries, err := os.ReadDir(filepath.Join(d.root, "pods"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	removed := 0
	for _, e := range entries {
		if keep(e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(d.root, "pods", e.Name())); err != nil {
			return removed, err
		}
		removed++
	}
	return removed, nil
}
