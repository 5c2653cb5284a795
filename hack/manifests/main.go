// Command manifests writes the plain manifests under deploy/ from the Helm
// chart (`make manifests`); with --check it only says which differ.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/tessera-gpu/tessera/deploy/chart"
)

func main() {
	dir := flag.String("dir", "deploy", "where the plain manifests live")
	check := flag.Bool("check", false, "write nothing; exit 1 when a file differs from the chart's rendering")
	flag.Parse()
	files, err := chart.Manifests()
	if err != nil {
		fmt.Fprintf(os.Stderr, "manifests: rendering deploy/chart/tessera: %v\n", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	stale := 0
	for _, n := range names {
		p := filepath.Join(*dir, n)
		old, _ := os.ReadFile(p)
		if bytes.Equal(old, []byte(files[n])) {
			continue
		}
		if *check {
			fmt.Fprintf(os.Stderr, "manifests: %s differs from the chart's rendering; run `make manifests`\n", p)
			stale++
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "manifests: %v\n", err)
			os.Exit(1)
		}
		if err := os.WriteFile(p, []byte(files[n]), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "manifests: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("wrote %s\n", p)
	}
	if stale > 0 {
		os.Exit(1)
	}
}
