//go:build linux

package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/internal/imagebuild"
)

// pauseImage is the pod sandbox's image, built here from hack/e2enode/pause.
const pauseImage = "e2e.tessera.local/pause:e2e"

// runInside is the namespaces' first process: it makes the node, runs the
// checks and prints them, then stops the node.
func runInside(ctx context.Context, o options, scratch string) error {
	n := &node{o: o, scratch: scratch, logs: filepath.Join(scratch, "logs")}
	if err := os.MkdirAll(n.logs, 0o755); err != nil {
		return err
	}
	r := &report{start: time.Now()}
	defer func() { r.print(os.Stdout) }()
	if err := r.step("the node's namespaces: private mounts, scratch paths and sysctls, a veth network", n.isolate); err != nil {
		return err
	}
	defer n.stop()
	err := r.step("etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, kubelet, kube-proxy started", func() error {
		return n.up(ctx)
	})
	if err != nil {
		n.tail(os.Stderr)
		return err
	}
	c, err := newChecks(ctx, n, r)
	if err != nil {
		return err
	}
	if err := c.run(); err != nil {
		n.tail(os.Stderr)
		return err
	}
	return r.err()
}

// tail prints the end of every component's log, for a failed run.
func (n *node) tail(w io.Writer) {
	logs, _ := filepath.Glob(filepath.Join(n.logs, "*.log"))
	sort.Strings(logs)
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(w, "--- the end of %s\n%s\n", filepath.Base(l), strings.Join(lines, "\n"))
	}
}

// importImages builds the pause image and imports it and every archive make
// images wrote into containerd's k8s.io namespace; it returns the tag the
// archives carry.
func (n *node) importImages(ctx context.Context) (string, error) {
	pause := filepath.Join(n.o.nodeBin, "pause")
	img, err := imagebuild.Build(imagebuild.Spec{
		Layers:     []imagebuild.Layer{{Comment: "pause", Entries: []imagebuild.Entry{{Path: "pause", Mode: 0o755, Source: pause}}}},
		Entrypoint: []string{"/pause"}, User: "65535:65535", Created: time.Unix(0, 0).UTC(),
	}, "amd64")
	if err != nil {
		return "", fmt.Errorf("the pause image (from %s, make e2e-node builds it): %w", pause, err)
	}
	pauseArchive := filepath.Join(n.scratch, "pause.oci.tar")
	if _, err := imagebuild.WriteOCIArchive(pauseArchive, img, pauseImage, time.Unix(0, 0).UTC()); err != nil {
		return "", err
	}
	archives, _ := filepath.Glob(filepath.Join(n.o.images, "*.oci.tar"))
	if len(archives) == 0 {
		return "", fmt.Errorf("no image archives in %s: run make images REGISTRY=%s", n.o.images, n.o.registry)
	}
	tag := ""
	for _, a := range archives {
		ref, err := archiveRef(a)
		if err != nil {
			return "", err
		}
		name, t, ok := strings.Cut(ref[strings.LastIndex(ref, "/")+1:], ":")
		if !strings.HasPrefix(ref, n.o.registry+"/") || !ok {
			return "", fmt.Errorf("%s is %s, not tagged for %s: run make images REGISTRY=%s", a, ref, n.o.registry, n.o.registry)
		}
		if tag != "" && t != tag {
			return "", fmt.Errorf("the archives carry two tags, %s and %s (%s): run make images again", tag, t, name)
		}
		tag = t
	}
	for _, a := range append(archives, pauseArchive) {
		out, err := exec.CommandContext(ctx, filepath.Join(n.o.nodeBin, "ctr"), "--address", "/run/containerd/containerd.sock",
			"--namespace", "k8s.io", "images", "import", a).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("ctr images import %s: %v: %s", a, err, out)
		}
	}
	return tag, nil
}

// archiveRef reads the image reference an OCI archive's index names.
func archiveRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("%s has no index.json", archive)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", archive, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&index); err != nil {
			return "", fmt.Errorf("%s's index.json: %w", archive, err)
		}
		for _, m := range index.Manifests {
			if ref := m.Annotations["org.opencontainers.image.ref.name"]; ref != "" {
				return ref, nil
			}
		}
		return "", fmt.Errorf("%s's index names no image", archive)
	}
}
