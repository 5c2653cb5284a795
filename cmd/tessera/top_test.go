package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/gpu"
	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/top"
)

// TestTopAsData runs `tessera top -o json` and `-o yaml` against a
// playground with a GPU pod running, as a kubectl user would pipe them to
// jq or yq: both parse back into top.Snapshot with the node's GPUs and the
// pod among their tenants (issue 39: -o was checked, then ignored, and the
// table printed). Bad combinations exit 2.
func TestTopAsData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a playground; skipped with -short")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c, err := playground.Up(context.Background(), playground.Options{Nodes: 1, GPUsPerNode: 2, Model: "h100", MPSControl: []string{exe, "mps-control"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Down)
	if err := playground.Submit(context.Background(), c.Client, "team", []playground.PodSpec{{Name: "infer", GPUs: 1, MemoryMiB: 8192, Cores: 25, Sharing: gpu.ModeTimeSlicing}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var snaps map[string]top.Snapshot
	for {
		snaps = map[string]top.Snapshot{}
		for _, format := range []string{"json", "yaml"} {
			code, out, errOut := runCLI(t, "top", "--kubeconfig", c.Kubeconfig, "--metrics", c.Nodes[0].MetricsURL, "-o", format)
			if code != exitOK {
				t.Fatalf("-o %s: exit %d, stderr %q", format, code, errOut)
			}
			var snap top.Snapshot
			if format == "json" {
				err = json.Unmarshal([]byte(out), &snap)
			} else {
				err = yaml.Unmarshal([]byte(out), &snap)
			}
			if err != nil {
				t.Fatalf("-o %s does not parse back: %v\n%s", format, err, out)
			}
			snaps[format] = snap
		}
		if tenants(snaps["json"]) == 1 && tenants(snaps["yaml"]) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for format, snap := range snaps {
		if len(snap.GPUs) != 2 || snap.GPUs[0].Node != c.Nodes[0].Name {
			t.Errorf("-o %s: GPUs %+v, want the 2 of %s", format, snap.GPUs, c.Nodes[0].Name)
		}
		if n := tenants(snap); n != 1 {
			t.Errorf("-o %s: %d tenants, want team/infer", format, n)
		}
		for _, g := range snap.GPUs {
			for _, tn := range g.Tenants {
				if tn.Namespace+"/"+tn.Pod != "team/infer" || tn.MemoryMiB != 8192 || tn.CoresPercent != 25 {
					t.Errorf("-o %s: tenant %+v", format, tn)
				}
			}
		}
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--watch=-1s"}, "--watch -1s: give a positive interval"},
		{[]string{"--web", "127.0.0.1:0", "-o", "json"}, "give one or the other"},
	} {
		code, _, errOut := runCLI(t, append([]string{"top", "--kubeconfig", c.Kubeconfig}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}

func tenants(s top.Snapshot) int {
	n := 0
	for _, g := range s.GPUs {
		n += len(g.Tenants)
	}
	return n
}

// TestWebViewBindsTheLoopback: --web :PORT serves the loopback only; an
// address that reaches other hosts is served with a warning unless a token
// guards it, and the printed link carries the token (issue 39: the README's
// --web :8080 served every tenant's usage, unauthenticated, on every
// interface).
func TestWebViewBindsTheLoopback(t *testing.T) {
	collect := func(context.Context) (*top.Snapshot, error) { return &top.Snapshot{}, nil }
	for _, tc := range []struct {
		addr, token string
		wantURL     string // prefix
		warns       bool
	}{
		{":0", "", "http://127.0.0.1:", false},
		{"0.0.0.0:0", "", "http://localhost:", true},
		{"0.0.0.0:0", "s3cret", "http://localhost:", false},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		var warn strings.Builder
		url, done, err := serveWeb(ctx, tc.addr, tc.token, &warn, collect)
		if err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		if !strings.HasPrefix(url, tc.wantURL) || (tc.token != "") != strings.HasSuffix(url, "/?token="+tc.token) {
			t.Errorf("--web %s (token %q): link %s", tc.addr, tc.token, url)
		}
		if got := strings.Contains(warn.String(), "without a password; give --web-token"); got != tc.warns {
			t.Errorf("--web %s (token %q): warning %q", tc.addr, tc.token, warn.String())
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("--web %s: %v", tc.addr, err)
		}
	}
	if _, _, err := serveWeb(context.Background(), "8080", "", io.Discard, collect); err == nil || !strings.Contains(err.Error(), `--web "8080": want host:port or :port`) {
		t.Errorf("--web 8080: %v", err)
	}
}
