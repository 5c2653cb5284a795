//go:build linux

// Command e2enode is make e2e-node: Tessera's chart installed, from the
// images make images built, on a one-node Kubernetes cluster of real
// components (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// kubelet, kube-proxy, containerd with Debian's runc and CNI plugins), and
// checked as an operator would.
//
// The node lives in namespaces this program makes (mount, network, pid,
// UTS): the paths kubelet and containerd write are scratch directories
// mounted over theirs, the network is a veth pair with no way off the
// machine, the sysctls kubelet sets are scratch files over /proc/sys's, and
// its cgroups sit under one directory per hierarchy that the program removes.
// Before and after, it records the host's state (internal/hoststate) and
// fails when anything differs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/tessera-gpu/tessera/internal/hoststate"
)

// envInside marks the re-run inside the namespaces; its value is the scratch
// directory.
const envInside = "TESSERA_E2E_NODE_SCRATCH"

// envCgroup names, for the re-run, the node's parent cgroup: one per run,
// so that two runs on one machine keep apart.
const envCgroup = "TESSERA_E2E_NODE_CGROUP"

type options struct {
	nodeBin    string // the components' binaries (make node-tools)
	tesseraBin string // the tessera command, for its doctor
	images     string // make images' archives
	chart      string // the chart, as the README installs it
	registry   string
	timeout    time.Duration
	cgroupName string
}

func main() {
	o := options{nodeBin: "bin/node", tesseraBin: "bin/tessera", images: "out/images", chart: "deploy/chart/tessera",
		timeout: 15 * time.Minute, cgroupName: fmt.Sprintf("tessera-e2e-node-%d", os.Getpid())}
	flag.StringVar(&o.registry, "registry", "e2e.tessera.local", "the registry make images tagged the archives for (make e2e-node passes E2E_REGISTRY)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: %s [--registry R], from the repository's root, as root (make e2e-node builds what it needs first)\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fail(fmt.Errorf("unexpected arguments %q", flag.Args()))
	}
	for _, p := range []*string{&o.nodeBin, &o.tesseraBin, &o.images, &o.chart} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			fail(err)
		}
		if _, err := os.Stat(abs); err != nil {
			fail(fmt.Errorf("%s: %w (run make e2e-node from the repository's root: it builds the node's components, the images and bin/tessera)", *p, err))
		}
		*p = abs
	}
	if scratch, inside := os.LookupEnv(envInside); inside {
		o.cgroupName = os.Getenv(envCgroup)
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		defer cancel()
		if err := runInside(ctx, o, scratch); err != nil {
			fmt.Fprintf(os.Stderr, "e2e-node: %v\n", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runOutside(ctx, o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "e2e-node: %v\n", err)
	os.Exit(1)
}

// The host paths a node's components write, whose listings the host check
// compares; and the programs whose processes must not outlive the run.
var (
	watchedPaths = []string{
		"/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/var/lib/etcd", "/run/containerd",
		"/run/netns", "/run/runc", "/run/tessera", "/var/run/cdi", "/etc/cdi", "/etc/cni", "/opt/cni",
		"/etc/kubernetes", "/etc/containerd", "/var/log/pods", "/var/log/containers", "/etc/resolv.conf", "/etc/hosts",
	}
	watchedPrograms = []string{
		"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy",
		"containerd", "containerd-shim-runc-v2", "runc", "pause", "tessera-scheduler", "tessera-agent",
	}
)

func runOutside(ctx context.Context, o options) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: it makes mount, network and pid namespaces and cgroups for the node (sudo make e2e-node)")
	}
	for _, need := range []string{"runc", "iptables", "ip"} {
		if _, err := exec.LookPath(need); err != nil {
			return fmt.Errorf("%s not found: make e2e-node installs Debian's runc, containernetworking-plugins, iptables and iproute2", need)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		return errors.New("no CNI plugins in /usr/lib/cni: apt-get install containernetworking-plugins")
	}
	scratch, err := os.MkdirTemp("", "tessera-e2e-node-")
	if err != nil {
		return err
	}
	hostOpts := hoststate.Options{Paths: watchedPaths, Programs: watchedPrograms, Skip: scratch}
	started := time.Now()
	before := hoststate.Take(ctx, hostOpts)
	fmt.Printf("host state before: %s (%.1f s)\n", before.Lines(), time.Since(started).Seconds())

	cgroups, err := makeCgroups("/sys/fs/cgroup", o.cgroupName)
	if err != nil {
		_ = removeCgroups(cgroups, time.Second) // those made before the failure
		return err
	}
	cmd := exec.CommandContext(ctx, "/proc/self/exe", os.Args[1:]...)
	cmd.Env = append(os.Environ(), envInside+"="+scratch, envCgroup+"="+o.cgroupName)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		Pdeathsig:  syscall.SIGKILL,
	}
	// Pdeathsig follows the thread that started the child.
	runtime.LockOSThread()
	runErr := cmd.Run()
	runtime.UnlockOSThread()

	// The namespace's first process is gone, so the kernel has killed every
	// process in it; their cgroups empty as they exit.
	if err := removeCgroups(cgroups, 60*time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "e2e-node: %v\n", err)
	}
	// A failed run's logs and configuration stay for the operator; they
	// are in the scratch directory, which the host check leaves out.
	if runErr != nil {
		fmt.Printf("the run failed: its logs and configuration are kept in %s (logs/ has each component's)\n", scratch)
	} else if err := os.RemoveAll(scratch); err != nil {
		fmt.Fprintf(os.Stderr, "e2e-node: removing %s: %v\n", scratch, err)
	}
	started = time.Now()
	after := hoststate.Take(context.WithoutCancel(ctx), hostOpts)
	diff := hoststate.Diff(before, after)
	fmt.Printf("host state after:  %s (%.1f s)\n", after.Lines(), time.Since(started).Seconds())
	if len(diff) == 0 {
		fmt.Println("host state: as found (mounts, sysctls, cgroups, links, routes, firewall rules, files under the node's paths, processes)")
	} else {
		fmt.Println("host state: CHANGED")
		for _, d := range diff {
			fmt.Println("  " + d)
		}
	}
	switch {
	case runErr != nil:
		return fmt.Errorf("the node's run failed: %w", runErr)
	case len(diff) > 0:
		return fmt.Errorf("the host is not as it was found: %d differences", len(diff))
	}
	return nil
}

// makeCgroups makes the node's parent cgroup in every hierarchy mounted
// under root (/sys/fs/cgroup; kubelet's cgroupRoot), so everything the node
// starts is found and removed there: one directory where cgroup v2 is
// mounted alone, one per hierarchy on cgroup v1.
func makeCgroups(root, name string) ([]string, error) {
	var made []string
	add := func(dir string) error {
		if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		made = append(made, dir)
		// A cpuset cgroup v1 starts with no CPUs and memory nodes: give it
		// its parent's.
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
				}
			}
		}
		return nil
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return made, add(filepath.Join(root, name)) // cgroup v2 alone
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		hierarchy := filepath.Join(root, e.Name())
		if _, err := os.Stat(filepath.Join(hierarchy, "cgroup.procs")); err != nil {
			continue
		}
		if err := add(filepath.Join(hierarchy, name)); err != nil {
			return made, fmt.Errorf("making the node's cgroup: %w", err)
		}
	}
	if len(made) == 0 {
		return nil, fmt.Errorf("no cgroup hierarchy under %s", root)
	}
	return made, nil
}

// removeCgroups removes the node's cgroups, deepest first, waiting up to
// wait for the processes in them to end.
func removeCgroups(roots []string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		var left []string
		for _, root := range roots {
			var dirs []string
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
					left = append(left, dirs[i])
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroups still busy after %s: %s", wait, strings.Join(left, ", "))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
