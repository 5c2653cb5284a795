// Package hoststate records what a node's components could leave behind on a
// host — mounts, sysctls, firewall rules, cgroups, network links and routes,
// the files (names and modes) under the paths kubelet and containerd use,
// their processes — so that make e2e-node can show the host is as it found
// it. Take reads; Diff is pure.
package hoststate

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// State is one snapshot: per section, its lines in order.
type State map[string][]string

// Options says where to look. Zero values take the host's own places.
type Options struct {
	// Paths whose trees are listed (type, size and mode of every entry).
	Paths []string
	// Programs whose running processes are counted, by executable name.
	Programs []string
	// Skip is a path (the run's scratch directory) left out of the listings.
	Skip string
	// Proc and Sys default to /proc and /sys.
	Proc, Sys string
}

// volatileSysctls change on their own from one second to the next (counters,
// random values): comparing them says nothing about who changed the host.
var volatileSysctls = map[string]bool{
	"fs/dentry-state": true, "fs/file-nr": true, "fs/inode-nr": true, "fs/inode-state": true,
	"fs/aio-nr": true, "kernel/ns_last_pid": true, "kernel/pty/nr": true,
	"kernel/random/uuid": true, "kernel/random/boot_id": true, "kernel/random/entropy_avail": true,
	"net/netfilter/nf_conntrack_count": true, "fs/quota/syncs": true,
	"fs/quota/lookups": true, "fs/quota/reads": true, "fs/quota/writes": true,
	"fs/quota/allocated_dquots": true, "fs/quota/free_dquots": true, "fs/quota/cache_hits": true,
	"fs/quota/drops": true, "fs/quota/free": true,
}

// Take reads the host's state as o says. A section that cannot be read (a
// program missing) holds the reason, so two snapshots still compare.
func Take(ctx context.Context, o Options) State {
	if o.Proc == "" {
		o.Proc = "/proc"
	}
	if o.Sys == "" {
		o.Sys = "/sys"
	}
	s := State{}
	s["mounts"] = or(mounts(filepath.Join(o.Proc, "self/mountinfo")))
	s["sysctls"] = or(sysctls(filepath.Join(o.Proc, "sys")))
	s["cgroups"] = or(dirs(filepath.Join(o.Sys, "fs/cgroup")))
	s["links"] = or(links())
	for _, p := range [][]string{
		{"iptables", "iptables-save"}, {"ip6tables", "ip6tables-save"},
		{"iptables-legacy", "iptables-legacy-save"}, {"ip6tables-legacy", "ip6tables-legacy-save"},
		{"nftables", "nft", "list", "ruleset"}, {"routes", "ip", "-o", "route", "show", "table", "all"},
		{"routes6", "ip", "-o", "-6", "route", "show", "table", "all"},
	} {
		if _, err := exec.LookPath(p[1]); err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, p[1], p[2:]...).Output()
		if err != nil {
			s[p[0]] = []string{fmt.Sprintf("(%s: %v)", p[1], err)}
			continue
		}
		s[p[0]] = Rules(string(out))
	}
	var files []string
	for _, p := range o.Paths {
		files = append(files, tree(p, o.Skip)...)
	}
	s["files"] = files
	s["processes"] = or(processes(o.Proc, o.Programs))
	if h, err := os.Hostname(); err == nil {
		s["hostname"] = []string{h}
	}
	return s
}

func or(lines []string, err error) []string {
	if err != nil {
		return []string{fmt.Sprintf("(unreadable: %v)", err)}
	}
	return lines
}

// Rules keeps a firewall or route dump's content: comments and packet
// counters, which change with traffic, go.
func Rules(dump string) []string {
	var out []string
	for _, l := range strings.Split(dump, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, ":") { // ":INPUT ACCEPT [12:3456]"
			if i := strings.LastIndex(l, " ["); i > 0 {
				l = l[:i]
			}
		}
		out = append(out, l)
	}
	return out
}

// mounts lists each mount as its point, type and source (mount IDs and
// options change with no one's doing).
func mounts(mountinfo string) ([]string, error) {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		out = append(out, f[4]+" "+f[sep+1]+" "+f[sep+2])
	}
	sort.Strings(out)
	return out, nil
}

func sysctls(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		key := strings.TrimPrefix(p, root+"/")
		if volatileSysctls[key] {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil { // write-only or refused
			return nil
		}
		out = append(out, key+" = "+strings.Join(strings.Fields(string(b)), " "))
		return nil
	})
	return out, err
}

func dirs(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

func links() ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, i := range ifs {
		addrs, _ := i.Addrs()
		var as []string
		for _, a := range addrs {
			as = append(as, a.String())
		}
		sort.Strings(as)
		out = append(out, fmt.Sprintf("%s %s mtu %d %s", i.Name, i.Flags, i.MTU, strings.Join(as, " ")))
	}
	sort.Strings(out)
	return out, nil
}

// tree lists p and everything below it, name and mode; a missing path is
// one line saying so.
func tree(p, skip string) []string {
	if _, err := os.Lstat(p); os.IsNotExist(err) {
		return []string{p + " absent"}
	}
	var out []string
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			out = append(out, q+" (unreadable)")
			return nil
		}
		if skip != "" && (q == skip || strings.HasPrefix(q, skip+"/")) {
			return fs.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		// Names and modes, not sizes or times: on a machine that is itself
		// a node, the host's kubelet writes its logs and state all along.
		out = append(out, fmt.Sprintf("%s %s", q, info.Mode()))
		return nil
	})
	return out
}

// processes counts running processes by executable name, for the names
// given: a node's components left running show here.
func processes(proc string, programs []string) ([]string, error) {
	want := map[string]bool{}
	for _, p := range programs {
		want[p] = true
	}
	entries, err := os.ReadDir(proc)
	if err != nil {
		return nil, err
	}
	count := map[string]int{}
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline"))
		if err != nil || len(comm) == 0 {
			continue
		}
		name := filepath.Base(string(bytes.SplitN(comm, []byte{0}, 2)[0]))
		if want[name] {
			count[name]++
		}
	}
	var out []string
	for n, c := range count {
		out = append(out, fmt.Sprintf("%s ×%d", n, c))
	}
	sort.Strings(out)
	return out, nil
}

// Diff says what changed from before to after, section by section: "+" for
// a line that appeared, "-" for one that went. Nothing changed: nil.
func Diff(before, after State) []string {
	names := map[string]bool{}
	for k := range before {
		names[k] = true
	}
	for k := range after {
		names[k] = true
	}
	var sections []string
	for k := range names {
		sections = append(sections, k)
	}
	sort.Strings(sections)
	var out []string
	for _, sec := range sections {
		b, a := counts(before[sec]), counts(after[sec])
		var lines []string
		for l, n := range b {
			for i := a[l]; i < n; i++ {
				lines = append(lines, "- "+l)
			}
		}
		for l, n := range a {
			for i := b[l]; i < n; i++ {
				lines = append(lines, "+ "+l)
			}
		}
		sort.Slice(lines, func(i, j int) bool { return lines[i][2:]+lines[i][:1] < lines[j][2:]+lines[j][:1] })
		for _, l := range lines {
			out = append(out, sec+": "+l)
		}
	}
	return out
}

func counts(lines []string) map[string]int {
	m := map[string]int{}
	for _, l := range lines {
		m[l]++
	}
	return m
}

// Lines counts the lines a snapshot holds, per section, for a summary.
func (s State) Lines() string {
	var parts []string
	for k, v := range s {
		parts = append(parts, fmt.Sprintf("%s %d", k, len(v)))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
