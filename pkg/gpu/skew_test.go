package gpu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The skew tests pin the promise of CodecVersion: across one minor release,
// tessera-scheduler and the agents can be upgraded in either order.
//
//   - testdata/skew/*-v1.json is what this release writes, byte for byte. A change
//     to it is a change to the wire format: keep it readable by the previous
//     release (add fields, never change one) or bump CodecVersion.
//   - testdata/skew/*-v1-next.json is what a next minor release may write: the
//     same objects with fields this release does not know, at every level. This
//     release must read them as the plain objects.

func readSkew(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "skew", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestSkewAssignment: an agent of this release reads the assignment a newer
// scheduler writes (scheduler upgraded first), and what this scheduler writes
// is what the previous release's agents were tested against (agents first).
func TestSkewAssignment(t *testing.T) {
	current := readSkew(t, "assignment-v1.json")
	want, err := DecodeAssignment(current)
	if err != nil {
		t.Fatalf("this release's own assignment: %v", err)
	}
	enc, err := EncodeAssignment(want)
	if err != nil {
		t.Fatal(err)
	}
	if enc != current {
		t.Errorf("the encoded assignment changed; the previous release reads exactly testdata/skew/assignment-v1.json:\n got %s\nwant %s", enc, current)
	}
	got, err := DecodeAssignment(readSkew(t, "assignment-v1-next.json"))
	if err != nil {
		t.Fatalf("a newer scheduler's assignment is refused: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("a newer scheduler's assignment reads differently (-plain +next):\n%s", diff)
	}
}

// TestSkewInventory: the scheduler of this release reads the inventory a newer
// agent publishes, and what this agent publishes is what the previous release's
// scheduler was tested against.
func TestSkewInventory(t *testing.T) {
	current := readSkew(t, "inventory-v1.json")
	want, err := DecodeInventory([]byte(current))
	if err != nil {
		t.Fatalf("this release's own inventory: %v", err)
	}
	enc, err := EncodeInventory(want)
	if err != nil {
		t.Fatal(err)
	}
	if string(enc) != current {
		t.Errorf("the encoded inventory changed; the previous release reads exactly testdata/skew/inventory-v1.json:\n got %s\nwant %s", enc, current)
	}
	got, err := DecodeInventory([]byte(readSkew(t, "inventory-v1-next.json")))
	if err != nil {
		t.Fatalf("a newer agent's inventory is refused: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("a newer agent's inventory reads differently (-plain +next):\n%s", diff)
	}
}

// TestSkewBreakingChangeRefused: a change an older reader must not skip comes
// with a new version, and the older reader refuses it with a message that says so.
func TestSkewBreakingChangeRefused(t *testing.T) {
	next := strings.Replace(readSkew(t, "assignment-v1.json"), `"v":"v1"`, `"v":"v2"`, 1)
	_, err := DecodeAssignment(next)
	if err == nil || !strings.Contains(err.Error(), `version "v2", this build reads "v1"`) {
		t.Fatalf("a v2 assignment: error %v, want a refusal naming both versions", err)
	}
}
