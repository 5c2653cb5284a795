// Package images is the recipe for Tessera's two container images, built
// offline: the binaries from this source tree, the agent's C library from
// Debian's own packages, assembled by imagebuild. `make images` runs it through
// hack/images; its test unpacks what it builds and runs each entrypoint.
package images

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/tessera-gpu/tessera/internal/imagebuild"
	"github.com/tessera-gpu/tessera/pkg/agent/shim"
	"github.com/tessera-gpu/tessera/pkg/version"
)

// DebianPackages are what the agent's image takes from Debian: the C library
// go-nvml's dlopen of libnvidia-ml.so.1 needs, and what it depends on. They
// come from the building machine's apt sources (Debian 12, bookworm, here);
// the versions used are in the image's dev.tessera.debian-packages label.
var DebianPackages = []string{"libc6", "libgcc-s1", "gcc-12-base"}

// ErrNoDebianPackages: this machine cannot fetch the agent's Debian packages.
var ErrNoDebianPackages = errors.New("the agent's image takes its C library from Debian packages, and none could be fetched here")

// NonRoot is the scheduler's user and group (distroless' "nonroot").
const NonRoot = "65532:65532"

// Options says where things are and what to stamp into the images.
type Options struct {
	// Repo is the source tree's root.
	Repo string
	// Work holds built binaries and downloaded packages between runs.
	Work string
	// Version and Revision are stamped into the binaries and the labels;
	// Created is every timestamp in the images (the commit's time, for one).
	Version, Revision string
	Created           time.Time
	// Progress, when set, hears each step.
	Progress func(format string, args ...any)
	// Prebuilt reuses the binaries and packages already in Work instead of
	// building and downloading them: a test of the assembly alone.
	Prebuilt bool
	// AptUpdate lets Debs fetch apt's package lists when they are missing
	// (as root): `make images` may, a test must not change the host.
	AptUpdate bool
}

// Built is one image written.
type Built struct {
	Name    string
	Archive string
	Digest  v1.Hash
	Size    int64 // of the archive, in bytes
	Image   v1.Image
}

// FromGit fills Version, Revision and Created from the repository's HEAD:
// `git describe`, the commit and its time, so a rebuild of one commit stamps
// the same.
func FromGit(ctx context.Context, repo string) (ver, rev string, created time.Time, err error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", repo}, args...)...)
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	if rev, err = git("rev-parse", "HEAD"); err != nil {
		return "", "", time.Time{}, fmt.Errorf("git rev-parse HEAD in %s: %w", repo, err)
	}
	ver, err = git("describe", "--tags", "--always", "--dirty")
	if err != nil {
		return "", "", time.Time{}, err
	}
	if dirty, _ := git("status", "--porcelain", "--untracked-files=no"); dirty != "" {
		rev += "-dirty"
	}
	ct, err := git("log", "-1", "--format=%ct")
	if err != nil {
		return "", "", time.Time{}, err
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return "", "", time.Time{}, fmt.Errorf("commit time %q: %w", ct, err)
	}
	return ver, rev, time.Unix(sec, 0).UTC(), nil
}

func (o Options) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(format, args...)
	}
}

// goBuild builds one command of the tree, reproducibly: no paths, no VCS
// stamp (the version comes in through -X), stripped.
func (o Options) goBuild(ctx context.Context, pkg, out string, cgo bool) error {
	if o.Prebuilt {
		return nil
	}
	o.progress("building %s (CGO_ENABLED=%v)", pkg, map[bool]int{true: 1, false: 0}[cgo])
	ldflags := fmt.Sprintf("-s -w -X %[1]s.Version=%[2]s -X %[1]s.Revision=%[3]s",
		"github.com/tessera-gpu/tessera/pkg/version", o.Version, o.Revision)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = o.Repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+map[bool]string{true: "1", false: "0"}[cgo])
	if cgo {
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, stderr.String())
	}
	return nil
}

// buildLibtessera builds the preload library (make in libtessera/, the C
// compiler) into dir, with the source paths in its debug information made
// relative so the same tree builds the same bytes anywhere.
func (o Options) buildLibtessera(ctx context.Context, dir string) error {
	if o.Prebuilt {
		return nil
	}
	o.progress("building libtessera (make -C libtessera)")
	src := filepath.Join(o.Repo, "libtessera")
	cmd := exec.CommandContext(ctx, "make", "-s", "-C", src, "OUT="+dir, dir+"/libtessera.so",
		"CFLAGS=-O2 -g -ffile-prefix-map="+src+"=libtessera")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building libtessera: %w\n%s", err, out)
	}
	return nil
}

// Debs downloads DebianPackages into Work/debs (apt-get download: the
// machine's apt sources, no registry) and unpacks each with dpkg-deb. It
// returns the unpacked root and "name=version" per package.
func (o Options) Debs(ctx context.Context) (root string, pkgs []string, err error) {
	if o.Prebuilt {
		b, err := os.ReadFile(filepath.Join(o.Work, "debroot.packages"))
		return filepath.Join(o.Work, "debroot"), strings.Fields(string(b)), err
	}
	for _, tool := range []string{"apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", nil, fmt.Errorf("%w: it needs %s (a Debian or Ubuntu machine): %v", ErrNoDebianPackages, tool, err)
		}
	}
	// A fresh directory each time: the versions are whatever apt's lists
	// name now, and never a file left from an earlier run.
	dir := filepath.Join(o.Work, "debs")
	if err := os.RemoveAll(dir); err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	download := func() ([]byte, error) {
		args := []string{"download", "-q"}
		if os.Geteuid() == 0 {
			// apt drops to _apt for downloads, which cannot write here.
			args = append(args, "-o", "APT::Sandbox::User=root")
		}
		cmd := exec.CommandContext(ctx, "apt-get", append(args, DebianPackages...)...)
		cmd.Dir = dir
		return cmd.CombinedOutput()
	}
	o.progress("downloading %s (apt-get download)", strings.Join(DebianPackages, ", "))
	if out, err := download(); err != nil {
		if os.Geteuid() != 0 || !o.AptUpdate {
			return "", nil, fmt.Errorf("%w: apt-get download %s: %v\n%s(apt's package lists may be missing: run `sudo apt-get update` once)", ErrNoDebianPackages, strings.Join(DebianPackages, " "), err, out)
		}
		// A fresh machine has no package lists yet; as root, fetch them once.
		o.progress("no package lists: apt-get update")
		if out, err := exec.CommandContext(ctx, "apt-get", "update", "-q").CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("apt-get update: %v\n%s", err, out)
		}
		if out, err := download(); err != nil {
			return "", nil, fmt.Errorf("apt-get download %s: %v\n%s", strings.Join(DebianPackages, " "), err, out)
		}
	}
	root = filepath.Join(o.Work, "debroot")
	if err := os.RemoveAll(root); err != nil {
		return "", nil, err
	}
	for _, name := range DebianPackages {
		matches, _ := filepath.Glob(filepath.Join(dir, name+"_*.deb"))
		if len(matches) != 1 {
			return "", nil, fmt.Errorf("apt-get download left %d files %s_*.deb in %s, want 1", len(matches), name, dir)
		}
		deb := matches[0]
		fields, err := exec.CommandContext(ctx, "dpkg-deb", "-f", deb, "Package", "Version").Output()
		if err != nil {
			return "", nil, fmt.Errorf("dpkg-deb -f %s: %w", deb, err)
		}
		kv := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(string(fields)), "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok {
				kv[k] = v
			}
		}
		pkgs = append(pkgs, kv["Package"]+"="+kv["Version"])
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("dpkg-deb -x %s: %v\n%s", deb, err, out)
		}
	}
	return root, pkgs, os.WriteFile(filepath.Join(o.Work, "debroot.packages"), []byte(strings.Join(pkgs, "\n")+"\n"), 0o644)
}

func (o Options) labels(title, description string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.source":      version.Source,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.created":     o.Created.Format(time.RFC3339),
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
}

// Scheduler builds tessera-scheduler's image: one static binary on an empty
// base, run as a non-root user.
func (o Options) Scheduler(ctx context.Context) (v1.Image, error) {
	bin := filepath.Join(o.Work, "bin", "tessera-scheduler")
	if err := o.goBuild(ctx, "./cmd/tessera-scheduler", bin, false); err != nil {
		return nil, err
	}
	return imagebuild.Build(imagebuild.Spec{
		Layers: []imagebuild.Layer{
			{Comment: "users", Entries: []imagebuild.Entry{
				{Path: "etc", Mode: 0o755, Dir: true},
				{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
				{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
				{Path: "tmp", Mode: 0o777, Dir: true},
			}},
			{Comment: "tessera-scheduler", Entries: []imagebuild.Entry{
				{Path: "usr", Mode: 0o755, Dir: true},
				{Path: "usr/local", Mode: 0o755, Dir: true},
				{Path: "usr/local/bin", Mode: 0o755, Dir: true},
				{Path: "usr/local/bin/tessera-scheduler", Mode: 0o755, Source: bin},
			}},
		},
		Entrypoint: []string{"/usr/local/bin/tessera-scheduler"},
		User:       NonRoot,
		Labels:     o.labels("tessera-scheduler", "kube-scheduler with Tessera's TesseraGPU plugin"),
		Created:    o.Created,
	}, runtime.GOARCH)
}

// Agent builds tessera-agent's image: the cgo binary over Debian's C library.
// It runs as root: it serves kubelet's device-plugin socket, reads the host's
// /proc and runs the driver's MPS and nvidia-smi tools.
func (o Options) Agent(ctx context.Context) (v1.Image, error) {
	root, pkgs, err := o.Debs(ctx)
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(o.Work, "bin", "tessera-agent")
	if err := o.goBuild(ctx, "./cmd/tessera-agent", bin, true); err != nil {
		return nil, err
	}
	lib := filepath.Join(o.Work, "libtessera", "libtessera.so")
	if err := o.buildLibtessera(ctx, filepath.Dir(lib)); err != nil {
		return nil, err
	}
	libc, err := imagebuild.TreeEntries(root, "")
	if err != nil {
		return nil, err
	}
	labels := o.labels("tessera-agent", "Tessera's node agent: NVML, the tessera.dev/gpu device plugin, MPS and time-slice policy")
	labels["dev.tessera.debian-packages"] = strings.Join(pkgs, " ")
	return imagebuild.Build(imagebuild.Spec{
		Layers: []imagebuild.Layer{
			{Comment: "debian: " + strings.Join(pkgs, " "), Entries: libc},
			{Comment: "tessera-agent", Entries: []imagebuild.Entry{
				{Path: "usr", Mode: 0o755, Dir: true},
				{Path: "usr/local", Mode: 0o755, Dir: true},
				{Path: "usr/local/bin", Mode: 0o755, Dir: true},
				{Path: "usr/local/bin/tessera-agent", Mode: 0o755, Source: bin},
				// What the agent copies to --shim-dir for containers.
				{Path: "usr/lib", Mode: 0o755, Dir: true},
				{Path: "usr/lib/tessera", Mode: 0o755, Dir: true},
				{Path: strings.TrimPrefix(shim.DefaultLibrary, "/"), Mode: 0o755, Source: lib},
			}},
		},
		Entrypoint: []string{"/usr/local/bin/tessera-agent"},
		User:       "0:0",
		// The NVIDIA container toolkit mounts the driver's libraries here.
		Env:     []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/lib64"},
		Labels:  labels,
		Created: o.Created,
	}, runtime.GOARCH)
}

// Write builds the named images ("tessera-scheduler", "tessera-agent") into
// dir as <name>.oci.tar, tagged <registry>/<name>:<version>.
func (o Options) Write(ctx context.Context, dir, registry string, names ...string) ([]Built, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var out []Built
	for _, name := range names {
		var img v1.Image
		var err error
		switch name {
		case "tessera-scheduler":
			img, err = o.Scheduler(ctx)
		case "tessera-agent":
			img, err = o.Agent(ctx)
		default:
			err = fmt.Errorf("no image named %q (tessera-scheduler, tessera-agent)", name)
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", name, err)
		}
		archive := filepath.Join(dir, name+".oci.tar")
		ref := fmt.Sprintf("%s/%s:%s", strings.TrimSuffix(registry, "/"), name, o.Version)
		digest, err := imagebuild.WriteOCIArchive(archive, img, ref, o.Created)
		if err != nil {
			return out, fmt.Errorf("%s: %w", name, err)
		}
		st, err := os.Stat(archive)
		if err != nil {
			return out, err
		}
		o.progress("%s: %s (%s, %.1f MiB)", name, archive, digest, float64(st.Size())/(1<<20))
		out = append(out, Built{Name: name, Archive: archive, Digest: digest, Size: st.Size(), Image: img})
	}
	return out, nil
}
