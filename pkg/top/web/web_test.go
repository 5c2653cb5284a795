package web

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/pkg/top"
)

// TestServerCachesAndSaysWhenStale: requests within Every share one read;
// a failed read keeps the last snapshot and says why; the page and its
// assets are served from the binary.
func TestServerCachesAndSaysWhenStale(t *testing.T) {
	var reads atomic.Int32
	var fail atomic.Bool
	s := &Server{Every: time.Hour, Collect: func(context.Context) (*top.Snapshot, error) {
		reads.Add(1)
		if fail.Load() {
			return nil, errors.New("the API server is unreachable")
		}
		return &top.Snapshot{GPUs: []top.GPU{{Node: "n1", UUID: "GPU-a", Healthy: true}}, Pending: 2}, nil
	}}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	get := func(path string) (string, int) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), resp.StatusCode
	}
	view := func() View {
		body, code := get("/api/snapshot")
		if code != http.StatusOK {
			t.Fatalf("/api/snapshot: %d %s", code, body)
		}
		var v View
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for range 3 {
		if v := view(); v.Pending != 2 || len(v.GPUs) != 1 || v.Error != "" {
			t.Fatalf("view %+v", v)
		}
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads for 3 requests within Every, want 1", n)
	}
	// Expire the snapshot and fail the next read.
	s.mu.Lock()
	s.last.Taken = time.Now().Add(-2 * time.Hour)
	s.mu.Unlock()
	fail.Store(true)
	if v := view(); len(v.GPUs) != 1 || !strings.Contains(v.Error, "unreachable") {
		t.Errorf("after a failed read: %+v, want the last snapshot and the error", v)
	}
	for path, want := range map[string]string{"/": "<title>Tessera", "/app.js": "api/snapshot", "/style.css": ".tile"} {
		if body, code := get(path); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("%s: %d, lacks %q", path, code, want)
		}
	}
}
