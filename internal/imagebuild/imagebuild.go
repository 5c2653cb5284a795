// Package imagebuild assembles OCI images from files on disk with
// go-containerregistry: no Docker daemon, no registry, no base image pulled.
// Everything that could vary between two builds of the same inputs is fixed
// (file times, owners, the order of entries, the creation time), so the same
// binaries and packages give the same image digest.
package imagebuild

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entry is one thing in a layer: a regular file (Data or Source), a directory
// (Dir) or a symbolic link (Link).
type Entry struct {
	// Path inside the image, without a leading slash: "usr/local/bin/x".
	Path string
	Mode fs.FileMode // permission bits only
	// Source is a file on disk whose bytes go in; Data is used when it is empty.
	Source string
	Data   []byte
	Dir    bool
	Link   string
}

// Layer is a named layer; the name goes into the image's history.
type Layer struct {
	Comment string
	Entries []Entry
}

// Spec describes one image.
type Spec struct {
	Layers     []Layer
	Entrypoint []string
	User       string // "65532:65532"
	Env        []string
	Labels     map[string]string
	// Created is every timestamp in the image: the config's, the history's and
	// each file's.
	Created time.Time
}

// Build assembles the image described by spec, for linux/amd64 or the
// architecture given in GOARCH-style arch.
func Build(spec Spec, arch string) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	var adds []mutate.Addendum
	for _, l := range spec.Layers {
		layer, err := tarLayer(l.Entries, spec.Created)
		if err != nil {
			return nil, fmt.Errorf("layer %q: %w", l.Comment, err)
		}
		adds = append(adds, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: spec.Created}, CreatedBy: "tessera imagebuild", Comment: l.Comment},
		})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = arch, "linux"
	cf.Created = v1.Time{Time: spec.Created}
	cf.Config = v1.Config{
		Entrypoint: spec.Entrypoint,
		User:       spec.User,
		Env:        spec.Env,
		Labels:     spec.Labels,
		WorkingDir: "/",
	}
	return mutate.ConfigFile(img, cf)
}

// tarLayer writes entries, sorted by path, into an uncompressed tar with
// every owner root and every time t, and wraps it as a gzip-compressed layer.
func tarLayer(entries []Entry, t time.Time) (v1.Layer, error) {
	sorted := append([]Entry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Path < sorted[j].Path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, e := range sorted {
		name := strings.TrimPrefix(path.Clean("/"+e.Path), "/")
		if name == "" || seen[name] {
			return nil, fmt.Errorf("path %q empty or given twice", e.Path)
		}
		seen[name] = true
		h := &tar.Header{Name: name, Mode: int64(e.Mode.Perm()), ModTime: t, Format: tar.FormatPAX,
			Uname: "root", Gname: "root"}
		var data []byte
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, name+"/"
		case e.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
		default:
			data = e.Data
			if e.Source != "" {
				b, err := os.ReadFile(e.Source)
				if err != nil {
					return nil, err
				}
				data = b
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		}
		// PAX records would carry access and change times; none are set.
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// TreeEntries lists a directory on disk (an unpacked .deb, say) as entries
// under prefix, keeping permission bits, directories and symbolic links.
func TreeEntries(root, prefix string) ([]Entry, error) {
	var out []Entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		name := path.Join(prefix, filepath.ToSlash(rel))
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out = append(out, Entry{Path: name, Mode: 0o777, Link: target})
		case info.IsDir():
			out = append(out, Entry{Path: name, Mode: info.Mode().Perm(), Dir: true})
		case info.Mode().IsRegular():
			out = append(out, Entry{Path: name, Mode: info.Mode().Perm(), Source: p})
		default:
			return fmt.Errorf("%s: neither file, directory nor link", p)
		}
		return nil
	})
	return out, err
}

// WriteOCIArchive writes img as an OCI image layout in a tar file at dst,
// tagged ref (org.opencontainers.image.ref.name), with fixed times so the
// archive itself is reproducible. It returns the manifest digest.
func WriteOCIArchive(dst string, img v1.Image, ref string, t time.Time) (v1.Hash, error) {
	dir, err := os.MkdirTemp(filepath.Dir(dst), ".oci-layout-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
		return v1.Hash{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return v1.Hash{}, err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: t, Mode: 0o644, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Size = tar.TypeReg, int64(len(b))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return v1.Hash{}, err
	}
	return digest, os.Rename(tmp, dst)
}

// ReadOCIArchive opens the single image of an archive WriteOCIArchive wrote,
// unpacking it under dir.
func ReadOCIArchive(archive, dir string) (v1.Image, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := untar(f, dir); err != nil {
		return nil, fmt.Errorf("%s: %w", archive, err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("%s holds %d images, want 1", archive, len(m.Manifests))
	}
	return idx.Image(m.Manifests[0].Digest)
}

// Unpack writes the image's flattened root file system under dir.
func Unpack(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	return untar(rc, dir)
}

// untar extracts regular files, directories and symbolic links under dir
// through an os.Root, so neither a name nor a link in the archive can reach
// outside dir.
func untar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		if parent := filepath.Dir(name); parent != "." {
			if err := root.MkdirAll(parent, 0o755); err != nil {
				return err
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, fs.FileMode(h.Mode).Perm()|0o700); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, name); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fs.FileMode(h.Mode).Perm()|0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: type %c not supported", h.Name, h.Typeflag)
		}
	}
}
