package main

import (
	"context"
	"fmt"
	"github.com/spf13/cobra"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/top"
)

// runTop is `tessera top`: who holds which GPU slice, from any cluster's
// API server, with live usage from the agents' metrics endpoints given.
func newTopCmd(stdout, stderr io.Writer, code *int) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Who holds which GPU slice, per GPU, from a kubeconfig",
		Long:  "Reads nodes and pods through the API server (the usual kubeconfig flags and\nloading rules apply) and prints every GPU with its tenants, their grants and,\nfrom the agents' metrics, their live usage.",
		Args:  cobra.NoArgs,
	}

	fs := cmd.Flags()
	var (
		output  = fs.StringP("output", "o", "", "output format: json or yaml (default: a table)")
		metrics = fs.String("metrics", "", "comma-separated agent metrics URLs (http://node:9401/metrics) for live usage per tenant (default: the tessera-agent pods in tessera-system, through the API server's proxy)")
		watch   = fs.Duration("watch", 0, "print again at this interval until Ctrl-C")
	)
	cluster := bindClusterFlags(fs)
	cmd.RunE = func(*cobra.Command, []string) error {
		*code = func() int {
			if err := checkOutput(*output); err != nil {
				fmt.Fprintf(stderr, "tessera top: %v\n", err)
				return exitUsage
			}
			cfg, err := cluster.restConfig()
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
		}()
		return nil
	}
	return cmd
}
