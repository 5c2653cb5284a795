package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
)

// kubeconfig points at nothing: the cases below stop before any request.
const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
users: [{name: u, user: {token: t}}]
`

func TestStartupErrors(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: tessera.dev/v1alpha1\nkind: TesseraConfiguration\nhealth:\n  quietPeriod: -5s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noDriver := func() gonvml.Interface {
		s := dgxh100.New()
		s.InitFunc = func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }
		return s
	}
	defer func(f func() gonvml.Interface) { newNVML = f }(newNVML)
	newNVML = noDriver
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"bad config names the field", []string{"--node", "n1", "--kubeconfig", kc, "--config", bad}, exitUsage, "health.quietPeriod: invalid value -5s"},
		{"no node", []string{"--kubeconfig", kc}, exitUsage, "--node"},
		{"no scheduler profile", []string{"--node", "n1", "--kubeconfig", kc, "--scheduler-names", " , "}, exitUsage, "--scheduler-names \" , \" names no scheduler profile"},
		{"no driver", []string{"--node", "n1", "--kubeconfig", kc, "--pod-resources-socket", filepath.Join(dir, "pr.sock")}, exitNoDriver, "no NVIDIA driver"},
		{"unknown flag", []string{"--gpus", "8"}, exitUsage, "flag provided but not defined"},
		{"refused grace not positive", []string{"--node", "n1", "--kubeconfig", kc, "--refused-grace", "0s"}, exitUsage, "--refused-grace 0s: give a positive duration, such as 5m0s"},
		{"refused grace not a duration", []string{"--node", "n1", "--kubeconfig", kc, "--refused-grace", "soon"}, exitUsage, `invalid value "soon" for flag -refused-grace`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", "")
			var errOut bytes.Buffer
			if code := run(context.Background(), tc.args, &errOut); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errOut.String(), tc.code, tc.want)
			}
		})
	}
}
