package tenantdir

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteFileFollowsNothing: what a tenant placed at the name is
// replaced, never written through.
func TestWriteFileFollowsNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		place func(t *testing.T, path, host string)
	}{
		{"nothing there", func(*testing.T, string, string) {}},
		{"a symlink to a host file", func(t *testing.T, path, host string) {
			if err := os.Symlink(host, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"a symlink to a missing host file", func(t *testing.T, path, host string) {
			if err := os.Symlink(host+".new", path); err != nil {
				t.Fatal(err)
			}
		}},
		{"a FIFO", func(t *testing.T, path, _ string) {
			if err := syscall.Mkfifo(path, 0o666); err != nil {
				t.Fatal(err)
			}
		}},
		{"a regular file", func(t *testing.T, path, _ string) {
			if err := os.WriteFile(path, []byte("old"), 0o666); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			host := filepath.Join(root, "host-secret")
			if err := os.WriteFile(host, []byte("root:x:0:0"), 0o600); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(root, "pod")
			if err := os.Mkdir(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			tc.place(t, filepath.Join(dir, "notice"), host)
			if err := WriteFile(dir, "notice", []byte(`{"preemptor":"a/b"}`), 0o644); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(host); string(b) != "root:x:0:0" {
				t.Fatalf("host file now %q", b)
			}
			if _, err := os.Lstat(host + ".new"); !os.IsNotExist(err) {
				t.Fatalf("a file was created through the symlink: %v", err)
			}
			fi, err := os.Lstat(filepath.Join(dir, "notice"))
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
				t.Fatalf("notice: %v, %v", fi.Mode(), err)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "notice")); string(b) != `{"preemptor":"a/b"}` {
				t.Fatalf("notice holds %q", b)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Fatalf("left behind: %v", entries)
			}
		})
	}
}

func TestWriteFileRefuses(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "pod")
	if err := os.MkdirAll(filepath.Join(dir, "notice"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(dir, "notice", []byte("x"), 0o644); err == nil {
		t.Error("wrote over a directory")
	}
	if err := WriteFile(dir, "../escape", []byte("x"), 0o644); err == nil {
		t.Error("wrote a path, not a name")
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(link, "notice", []byte("x"), 0o644); err == nil {
		t.Error("wrote through a symlinked directory")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("left behind: %v", entries)
	}
}

func TestHasFile(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "pod")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(root, "host-file")
	if err := os.WriteFile(host, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	check := func(want bool) {
		t.Helper()
		if got, err := HasFile(dir, "checkpointed"); err != nil || got != want {
			t.Fatalf("HasFile = %v, %v; want %v", got, err, want)
		}
	}
	check(false)
	if err := os.Symlink(host, filepath.Join(dir, "checkpointed")); err != nil {
		t.Fatal(err)
	}
	check(false) // a symlink to an existing host file does not count
	if err := os.Remove(filepath.Join(dir, "checkpointed")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpointed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	check(true)
	if got, err := HasFile(filepath.Join(root, "gone"), "checkpointed"); err != nil || got {
		t.Fatalf("missing directory: %v, %v", got, err)
	}
}
