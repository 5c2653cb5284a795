package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/pkg/top"
	"github.com/tessera-gpu/tessera/pkg/top/web"
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
		webAddr = fs.String("web", "", "serve a live web view at this address instead of printing, until Ctrl-C (:8080 is the loopback's; name an address, such as 0.0.0.0:8080, to serve other hosts)")
		token   = fs.String("web-token", os.Getenv("TESSERA_WEB_TOKEN"), "a token the web view asks of every request (default $TESSERA_WEB_TOKEN); the printed link carries it")
	)
	cluster := bindClusterFlags(fs)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		*code = func() int {
			if err := checkOutput(*output); err != nil {
				fmt.Fprintf(stderr, "tessera top: %v\n", err)
				return exitUsage
			}
			switch {
			case *watch < 0:
				fmt.Fprintf(stderr, "tessera top: --watch %s: give a positive interval, such as 5s (or none, to print once)\n", *watch)
				return exitUsage
			case *webAddr != "" && (*output != "" || *watch != 0):
				fmt.Fprintln(stderr, "tessera top: --web serves a live page; -o and --watch print to the terminal: give one or the other")
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
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			collect := collector(client, strings.Split(*metrics, ","), func(err error) {
				// Usage is extra: the view stands without it.
				fmt.Fprintf(stderr, "tessera top: live usage incomplete: %v\n", err)
			})
			if *webAddr != "" {
				url, done, err := serveWeb(ctx, *webAddr, *token, stderr, collect)
				if err != nil {
					fmt.Fprintf(stderr, "tessera top: %v\n", err)
					return exitUsage
				}
				fmt.Fprintf(stdout, "Web view at %s (Ctrl-C stops)\n", url)
				if err := <-done; err != nil {
					fmt.Fprintf(stderr, "tessera top: %v\n", err)
					return exitError
				}
				return exitOK
			}
			for {
				snap, err := collect(ctx)
				if err != nil {
					fmt.Fprintf(stderr, "tessera top: %v\n", err)
					return exitError
				}
				switch {
				case *output == "yaml" && *watch > 0:
					// One YAML document per interval, as kubectl get -w -o yaml.
					fmt.Fprintln(stdout, "---")
					fallthrough
				case *output != "":
					if err := printData(stdout, *output, snap); err != nil {
						fmt.Fprintf(stderr, "tessera top: %v\n", err)
						return exitError
					}
				default:
					if *watch > 0 {
						fmt.Fprintf(stdout, "\n%s\n", time.Now().Format(time.TimeOnly))
					}
					if err := top.Render(stdout, snap); err != nil {
						return exitError
					}
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

// collector reads what `tessera top` shows: the GPUs and their tenants
// (nodes and pods, through the API server), and each tenant's live usage
// from the agents' metrics at metricsURLs, or, when none is given, from the
// tessera-agent pods through the API server's proxy. Missing usage is
// reported to warn, not an error.
func collector(client kubernetes.Interface, metricsURLs []string, warn func(error)) func(context.Context) (*top.Snapshot, error) {
	var urls []string
	for _, m := range metricsURLs {
		if m = strings.TrimSpace(m); m != "" {
			urls = append(urls, m)
		}
	}
	return func(ctx context.Context) (*top.Snapshot, error) {
		snap, err := top.Collect(ctx, client)
		if err != nil {
			return nil, err
		}
		if len(urls) == 0 {
			if _, err := snap.AddUsageFromAgents(ctx, client); err != nil {
				warn(err)
			}
		}
		for _, u := range urls {
			if err := snap.AddUsage(ctx, u); err != nil {
				warn(err)
			}
		}
		return snap, nil
	}
}

// serveWeb serves the web view (pkg/top/web) at addr until ctx ends; done
// yields the server's end. An address without a host (":8080") is the
// loopback's: the page shows every tenant's pods and usage, so serving it
// to other hosts is asked for by naming an address, and warned about
// (on warn) when no token guards it.
func serveWeb(ctx context.Context, addr, token string, warn io.Writer, collect func(context.Context) (*top.Snapshot, error)) (url string, done <-chan error, err error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, fmt.Errorf("--web %q: want host:port or :port: %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return "", nil, fmt.Errorf("web view: %w", err)
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() && token == "" {
		fmt.Fprintf(warn, "warning: the web view on %s shows every tenant's pods and GPU usage to anyone who reaches this machine, without a password; give --web-token (or $TESSERA_WEB_TOKEN), or serve it on 127.0.0.1\n", ln.Addr())
	}
	srv := &http.Server{Handler: (&web.Server{Collect: collect, Token: token}).Handler(), ReadHeaderTimeout: 10 * time.Second}
	out := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		out <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	host, port, _ = net.SplitHostPort(ln.Addr().String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	url = "http://" + net.JoinHostPort(host, port) + "/"
	if token != "" {
		url += "?token=" + neturl.QueryEscape(token)
	}
	return url, out, nil
}
