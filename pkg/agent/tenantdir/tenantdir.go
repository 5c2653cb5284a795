// Package tenantdir reads and writes files in a directory that a tenant's
// container can also write (a pod's preemption notice directory, mounted
// read-write into its GPU containers), without following anything the
// tenant placed there. The agent runs as root on the host: a symlink named
// like the file it writes would otherwise make it overwrite any host file.
//
// The directory itself must be one the tenant cannot replace (the agent
// creates it; the container sees only its contents); every name inside is
// untrusted.
package tenantdir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// openDir opens dir itself, refusing a symlink in its place.
func openDir(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", dir, err)
	}
	return fd, nil
}

// checkName refuses names that are not a single entry of dir.
func checkName(name string) error {
	for i := 0; i < len(name); i++ {
		if name[i] == '/' {
			return fmt.Errorf("%q is not a file name", name)
		}
	}
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%q is not a file name", name)
	}
	return nil
}

// WriteFile puts data in dir/name. It writes a new file under a random
// name, created exclusively (so it is never a link the tenant made), then
// renames it over name: whatever stood there — a symlink, a FIFO, a file —
// is replaced, never followed or opened, and a reader sees the old content
// or the new, never half of it. A directory at name is an error.
func WriteFile(dir, name string, data []byte, perm uint32) error {
	if err := checkName(name); err != nil {
		return err
	}
	dfd, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	tmp := "." + name + ".tessera-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return fmt.Errorf("create %s in %s: %w", name, dir, err)
	}
	werr := writeAll(fd, data)
	if err := unix.Fchmod(fd, perm); werr == nil {
		werr = err // umask would otherwise narrow perm
	}
	if err := unix.Close(fd); werr == nil {
		werr = err
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, name)
	}
	if werr != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write %s in %s: %w", name, dir, werr)
	}
	return nil
}

func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		data = data[n:]
	}
	return nil
}

// HasFile reports whether dir/name is a regular file, looking at the entry
// itself: a symlink there is not followed and does not count.
func HasFile(dir, name string) (bool, error) {
	if err := checkName(name); err != nil {
		return false, err
	}
	dfd, err := openDir(dir)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	err = unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat %s in %s: %w", name, dir, err)
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG, nil
}
