package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/pkg/top"
)

// runTop is `tessera top`: who holds which GPU slice, from any cluster's
// API server, with live usage from the agents' metrics endpoints given.
func runTop(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tessera top", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		kubeconfig = fs.String("kubeconfig", "", "kubeconfig (default $KUBECONFIG, then ~/.kube/config)")
		metrics    = fs.String("metrics", "", "comma-separated agent metrics URLs (http://node:9400/metrics) for live usage per tenant (default: the tessera-agent pods in tessera-system, through the API server's proxy)")
		watch      = fs.Duration("watch", 0, "print again at this interval until Ctrl-C")
	)
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if *kubeconfig != "" {
		rules.ExplicitPath = *kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		fmt.Fprintf(stderr, "tessera top: %v\n", err)
		return exitUsage
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "tessera top: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for {
		snap, err := top.Collect(ctx, client)
		if err != nil {
			fmt.Fprintf(stderr, "tessera top: %v\n", err)
			return exitError
		}
		if *metrics == "" {
			// The agents' pods, through the API server's proxy.
			if _, err := snap.AddUsageFromAgents(ctx, client); err != nil {
				// Usage is extra: the table stands without it.
				fmt.Fprintf(stderr, "tessera top: live usage incomplete: %v\n", err)
			}
		}
		for _, m := range strings.Split(*metrics, ",") {
			if m = strings.TrimSpace(m); m == "" {
				continue
			}
			if err := snap.AddUsage(ctx, m); err != nil {
				fmt.Fprintf(stderr, "tessera top: no live usage from %v\n", err)
			}
		}
		if *watch > 0 {
			fmt.Fprintf(stdout, "\n%s\n", time.Now().Format(time.TimeOnly))
		}
		if err := top.Render(stdout, snap); err != nil {
			return exitError
		}
		if *watch <= 0 {
			return exitOK
		}
		select {
		case <-ctx.Done():
			return exitOK
		case <-time.After(*watch):
		}
	}
}
