package doclinks

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

var (
	link    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#+ +(.+?) *$`)
	fence   = regexp.MustCompile("(?ms)^```.*?^```")
)

// slug is the anchor GitHub gives a heading: lower case, punctuation
// dropped (hyphens and underscores kept), spaces as hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(string(b), ""), -1) {
		out[slug(m[1])] = true
	}
	return out
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Beside kube-scheduler, or instead of it": "beside-kube-scheduler-or-instead-of-it",
		"`make test`":                      "make-test",
		"Labels join with DCGM exporter's": "labels-join-with-dcgm-exporters",
		"TesseraAgentDown":                 "tesseraagentdown",
		"How long `make test` takes":       "how-long-make-test-takes",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestLinksResolve: README.md's and docs/*.md's relative links name files
// that exist, and their anchors headings there.
func TestLinksResolve(t *testing.T) {
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := append([]string{filepath.Join(root, "README.md")}, docs...)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := fence.ReplaceAllString(string(b), "")
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
			}
			rel, err := filepath.Rel(root, dest)
			if err != nil || strings.HasPrefix(rel, "..") {
				continue // outside the repository (../shared)
			}
			name, _ := filepath.Rel(root, f)
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s links %s: no such file", name, target)
				continue
			}
			checked++
			if anchor != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[anchor] {
				t.Errorf("%s links %s: %s has no heading #%s", name, target, rel, anchor)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d links; the pattern no longer finds them", checked)
	}
}
