// Package version is what a Tessera binary says of itself: the release and the
// source revision it was built from, set at link time by `make` and the image
// build (-ldflags "-X github.com/tessera-gpu/tessera/pkg/version.Version=…").
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

var (
	// Version is the release, for example v0.4.0; "dev" for a plain go build.
	Version = "dev"
	// Revision is the git commit; read from the build's VCS stamp when not set.
	Revision = ""
)

// Source is where the code lives, for the images' OCI labels.
const Source = "https://github.com/tessera-gpu/tessera"

// Rev is Revision, or the VCS revision Go stamped into the binary, or "unknown".
func Rev() string {
	if Revision != "" {
		return Revision
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			if dirty {
				rev += "-dirty"
			}
			return rev
		}
	}
	return "unknown"
}

// Dependency is the version of a module the binary was built with ("" when
// unknown): the scheduler reports the kube-scheduler it embeds.
func Dependency(module string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == module {
				if d.Replace != nil && d.Replace.Version != "" {
					return d.Replace.Version
				}
				return d.Version
			}
		}
	}
	return ""
}

// String is the line each binary prints for --version.
func String(binary string) string {
	return fmt.Sprintf("%s %s (revision %s, %s, %s/%s)", binary, Version, Rev(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
