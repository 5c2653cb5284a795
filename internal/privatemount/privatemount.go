//go:build linux

// Package privatemount lets a test binary use fixed host paths (kubelet's
// device-plugin directory, for one) without touching the host: the binary
// re-runs itself in a private mount namespace where each path is an empty
// tmpfs, and what the tests write there vanishes with the process.
//
// As root it needs only a new mount namespace; as an ordinary user it asks for
// a user namespace too (the kernel's unprivileged user namespaces). Where
// neither is allowed, the tests run in the plain process and Err says why, so a
// test that needs the paths can skip itself with that reason.
package privatemount

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// envChild marks the re-run; its value lists the paths to cover.
const envChild = "TESSERA_PRIVATE_MOUNTS"

var setupErr = errors.New("privatemount.Main was not called from TestMain")

// Main runs m with each of paths on a private, empty tmpfs and exits. Call it
// from TestMain in place of m.Run.
func Main(m *testing.M, paths ...string) {
	// LookupEnv, not Getenv: with no paths the value is empty, and the re-run
	// must still know it is the re-run rather than start another.
	if want, child := os.LookupEnv(envChild); child {
		setupErr = cover(strings.FieldsFunc(want, func(r rune) bool { return r == '\n' }))
		os.Exit(m.Run())
	}
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	// Newlines, not NULs, between the paths: exec refuses an environment
	// variable holding a NUL, which left every caller of two paths or more
	// without its namespace.
	cmd.Env = append(os.Environ(), envChild+"="+strings.Join(paths, "\n"))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() != 0 {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	// Pdeathsig follows the thread that started the child: keep it.
	runtime.LockOSThread()
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		os.Exit(0)
	case errors.As(err, &exit):
		os.Exit(exit.ExitCode())
	}
	// The namespace could not be made (a container without CAP_SYS_ADMIN, user
	// namespaces disabled): run here, and let the tests that need it skip.
	setupErr = fmt.Errorf("no private mount namespace for %s (%v): running here would write to the host", strings.Join(paths, ", "), err)
	os.Exit(m.Run())
}

// Err is nil when the paths given to Main are private to this process, or
// says why they are not.
func Err() error { return setupErr }

// cover makes every mount of this namespace private, so nothing mounted here
// reaches the host, then puts a tmpfs on each path: on the path itself when it
// exists, else on its deepest existing ancestor with the rest made inside.
func cover(paths []string) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private in the test's mount namespace: %w", err)
	}
	for _, p := range paths {
		top := filepath.Clean(p)
		for {
			if _, err := os.Stat(top); err == nil || top == "/" {
				break
			}
			top = filepath.Dir(top)
		}
		if top == "/" {
			return fmt.Errorf("refusing to cover / for %s", p)
		}
		if err := syscall.Mount("tessera-test", top, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", top, err)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
	}
	return nil
}
