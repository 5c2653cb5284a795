// Command images builds Tessera's container images as OCI archives, offline:
// `make images` runs it. See internal/images for what goes in.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/tessera-gpu/tessera/deploy"
	"github.com/tessera-gpu/tessera/internal/images"
)

func main() {
	var (
		out      = flag.String("out", "out/images", "where the archives go")
		work     = flag.String("work", "out/images/.work", "built binaries and downloaded packages")
		registry = flag.String("registry", "ghcr.io/tessera-gpu", "the registry the images are tagged for (their ref name in the archive)")
		only     = flag.String("only", "tessera-scheduler,tessera-agent", "the images to build, comma-separated")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *out, *work, *registry, strings.Split(*only, ",")); err != nil {
		fmt.Fprintf(os.Stderr, "images: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out, work, registry string, names []string) error {
	repo, err := os.Getwd()
	if err != nil {
		return err
	}
	o := images.Options{Repo: repo, Work: work, AptUpdate: true, Progress: func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "images: "+format+"\n", args...)
	}}
	if o.Work, err = filepath.Abs(work); err != nil {
		return err
	}
	if o.Version, o.Revision, o.Created, err = images.FromGit(ctx, repo); err != nil {
		return err
	}
	built, err := o.Write(ctx, out, registry, names...)
	if err != nil {
		return err
	}
	for _, b := range built {
		fmt.Printf("%s\t%s\t%s\t%d bytes\n", b.Name, b.Archive, b.Digest, b.Size)
	}
	fmt.Printf("\nTag: %s\nPush the archives to %s (crane push, skopeo copy oci-archive:…), then install with:\n%s\n",
		o.Version, registry, deploy.InstallCommand(strings.TrimSuffix(registry, "/"), o.Version))
	return nil
}
