package images

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/imagebuild"
	"github.com/tessera-gpu/tessera/pkg/agent/shim"
)

// TestImages builds both images as `make images` does (go build, apt-get
// download, assembly), reads each archive back, checks its labels and user,
// unpacks its root file system and runs its entrypoint with --version in a
// chroot of it. It then assembles both again from the same binaries and
// packages and wants the same digests.
func TestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries for their images (minutes on a cold cache)")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	o := Options{Repo: repo, Work: t.TempDir(), Version: "v0.0.0-imagetest", Revision: "0123456789abcdef",
		Created: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC), Progress: t.Logf}
	out := t.TempDir()

	for _, tc := range []struct {
		name, user string
		static     bool
	}{
		{"tessera-scheduler", NonRoot, true},
		{"tessera-agent", "0:0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			built, err := o.Write(ctx, out, "registry.example/tessera", tc.name)
			if err != nil {
				if errors.Is(err, ErrNoDebianPackages) {
					t.Skip(err)
				}
				t.Fatal(err)
			}
			b := built[0]
			img, err := imagebuild.ReadOCIArchive(b.Archive, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := img.Digest(); d != b.Digest {
				t.Errorf("archive holds %s, the build said %s", d, b.Digest)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range map[string]string{
				"org.opencontainers.image.source":   "https://github.com/tessera-gpu/tessera",
				"org.opencontainers.image.version":  o.Version,
				"org.opencontainers.image.revision": o.Revision,
			} {
				if got := cf.Config.Labels[k]; got != want {
					t.Errorf("label %s = %q, want %q", k, got, want)
				}
			}
			if cf.Config.User != tc.user {
				t.Errorf("user %q, want %q", cf.Config.User, tc.user)
			}
			rootfs := t.TempDir()
			// The image's user must be able to enter its own root.
			if err := os.Chmod(rootfs, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := imagebuild.Unpack(img, rootfs); err != nil {
				t.Fatal(err)
			}
			entry := cf.Config.Entrypoint[0]
			if tc.static {
				assertStatic(t, filepath.Join(rootfs, entry))
			}
			if tc.name == "tessera-agent" {
				// The agent's default --shim-library is in its image: a
				// shared object that needs only what every container with
				// a dynamic loader has (the C library and the loader).
				f, err := elf.Open(filepath.Join(rootfs, shim.DefaultLibrary))
				if err != nil {
					t.Fatalf("libtessera in the agent's image: %v", err)
				}
				libs, _ := f.ImportedLibraries()
				f.Close()
				if f.Type != elf.ET_DYN {
					t.Errorf("libtessera in the image is ELF type %v, want a shared object", f.Type)
				}
				for _, l := range libs {
					if l != "libc.so.6" && l != "libdl.so.2" && !strings.HasPrefix(l, "ld-linux") {
						t.Errorf("libtessera needs %s, which a tenant's container may lack (all: %v)", l, libs)
					}
				}
			}
			got := runInChroot(t, rootfs, tc.user, append(cf.Config.Entrypoint, "--version"), cf.Config.Env)
			if !strings.HasPrefix(got, tc.name+" v0.0.0-imagetest (revision 0123456789abcdef") {
				t.Errorf("%s --version in the image printed %q", entry, got)
			}
		})
	}

	// The same inputs assemble to the same digests.
	again := o
	again.Prebuilt = true
	for _, name := range []string{"tessera-scheduler", "tessera-agent"} {
		first, err := imagebuild.ReadOCIArchive(filepath.Join(out, name+".oci.tar"), t.TempDir())
		if err != nil {
			continue // skipped above
		}
		want, _ := first.Digest()
		rebuilt, err := again.Write(ctx, t.TempDir(), "registry.example/tessera", name)
		if err != nil {
			t.Fatal(err)
		}
		if rebuilt[0].Digest != want {
			t.Errorf("%s: rebuilt from the same inputs to %s, first %s", name, rebuilt[0].Digest, want)
		}
	}
}

// assertStatic wants no interpreter and no shared library in an ELF file.
func assertStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an ELF interpreter: not static", path)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs %v: not static", path, libs)
	}
}

// runInChroot runs argv with dir as its root, as the image's user where this
// process may switch to it (root), else as itself mapped to root in a user
// namespace (an ordinary user's run of make test).
func runInChroot(t *testing.T, dir, user string, argv, env []string) string {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	// exec resolves argv[0] on the host; the chroot makes it the image's.
	cmd.Path = argv[0]
	cmd.Env = env
	cmd.Dir = "/"
	attr := &syscall.SysProcAttr{Chroot: dir}
	if os.Geteuid() == 0 {
		u, g, _ := strings.Cut(user, ":")
		uid, uerr := strconv.ParseUint(u, 10, 32)
		gid, gerr := strconv.ParseUint(g, 10, 32)
		if uerr != nil || gerr != nil {
			t.Fatalf("user %q is not numeric uid:gid", user)
		}
		attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	} else {
		attr.Cloneflags = syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
	}
	cmd.SysProcAttr = attr
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if os.Geteuid() != 0 && strings.Contains(err.Error(), "operation not permitted") {
			t.Skipf("chroot needs root or an unprivileged user namespace, and neither is allowed here: %v", err)
		}
		t.Fatalf("%v in a chroot of the image: %v\n%s", argv, err, stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}
