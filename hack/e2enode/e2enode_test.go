//go:build linux

package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/internal/imagebuild"
)

// The cluster's certificates: each component's client certificate names its
// user and groups and verifies against the CA; the API server's serves its
// addresses.
func TestPKI(t *testing.T) {
	p, err := newPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.issue("kubelet", "system:node:n1", []string{"system:nodes"}); err != nil {
		t.Fatal(err)
	}
	if err := p.issue("apiserver", "kube-apiserver", nil, nodeIP, "kubernetes.default"); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.caCert)
	read := func(name string) *x509.Certificate {
		b, err := os.ReadFile(p.path(name + ".crt"))
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(b)
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	kubelet := read("kubelet")
	if kubelet.Subject.CommonName != "system:node:n1" || !reflect.DeepEqual(kubelet.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("kubelet's certificate names %q in %q", kubelet.Subject.CommonName, kubelet.Subject.Organization)
	}
	if _, err := kubelet.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("kubelet's client certificate: %v", err)
	}
	if _, err := read("apiserver").Verify(x509.VerifyOptions{Roots: roots, DNSName: nodeIP}); err != nil {
		t.Errorf("the API server's certificate for %s: %v", nodeIP, err)
	}
	kc, err := p.kubeconfig("kubelet", "https://"+nodeIP+":6443")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(kc)
	for _, want := range []string{"https://" + nodeIP + ":6443", p.path("kubelet.crt"), p.path("ca.crt")} {
		if !strings.Contains(string(b), want) {
			t.Errorf("kubelet's kubeconfig lacks %s:\n%s", want, b)
		}
	}
}

// archiveRef reads the reference make images writes into an archive.
func TestArchiveRef(t *testing.T) {
	img, err := imagebuild.Build(imagebuild.Spec{Layers: []imagebuild.Layer{{Comment: "x", Entries: []imagebuild.Entry{{Path: "x", Mode: 0o644, Data: []byte("x")}}}},
		Created: time.Unix(0, 0).UTC()}, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "tessera-agent.oci.tar")
	if _, err := imagebuild.WriteOCIArchive(archive, img, "e2e.tessera.local/tessera-agent:abc123", time.Unix(0, 0).UTC()); err != nil {
		t.Fatal(err)
	}
	if ref, err := archiveRef(archive); err != nil || ref != "e2e.tessera.local/tessera-agent:abc123" {
		t.Errorf("archiveRef = %q, %v", ref, err)
	}
	if _, err := archiveRef(filepath.Join(t.TempDir(), "missing.oci.tar")); err == nil {
		t.Error("archiveRef of a missing archive: no error")
	}
}

// The node's parent cgroup: one per hierarchy on cgroup v1, cpuset's seeded
// from its parent; one directory where cgroup v2 is mounted alone.
func TestMakeCgroups(t *testing.T) {
	touch := func(p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v1 := t.TempDir()
	for _, h := range []string{"cpu", "cpuset", "memory"} {
		touch(filepath.Join(v1, h, "cgroup.procs"), "")
	}
	touch(filepath.Join(v1, "cpuset", "cpuset.cpus"), "0-1\n")
	touch(filepath.Join(v1, "cpuset", "cpuset.mems"), "0\n")
	if err := os.Mkdir(filepath.Join(v1, "not-a-hierarchy"), 0o755); err != nil {
		t.Fatal(err)
	}
	made, err := makeCgroups(v1, "tessera-e2e-node-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(v1, "cpu/tessera-e2e-node-1"), filepath.Join(v1, "cpuset/tessera-e2e-node-1"), filepath.Join(v1, "memory/tessera-e2e-node-1")}
	if !reflect.DeepEqual(made, want) {
		t.Errorf("cgroup v1: made %q, want %q", made, want)
	}
	if b, _ := os.ReadFile(filepath.Join(v1, "cpuset/tessera-e2e-node-1/cpuset.cpus")); string(b) != "0-1\n" {
		t.Errorf("the cpuset cgroup's CPUs %q, want its parent's", b)
	}

	v2 := t.TempDir()
	touch(filepath.Join(v2, "cgroup.controllers"), "cpu memory pids\n")
	touch(filepath.Join(v2, "system.slice", "cgroup.procs"), "")
	if made, err := makeCgroups(v2, "tessera-e2e-node-1"); err != nil || !reflect.DeepEqual(made, []string{filepath.Join(v2, "tessera-e2e-node-1")}) {
		t.Errorf("cgroup v2: made %q, %v", made, err)
	}

	if _, err := makeCgroups(t.TempDir(), "x"); err == nil || !strings.Contains(err.Error(), "no cgroup hierarchy") {
		t.Errorf("no hierarchy: %v", err)
	}
}
