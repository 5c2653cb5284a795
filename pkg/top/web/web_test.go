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

// TestToken: with a token, every request without it is refused (401, with
// what to do); the printed link's ?token= opens the page and leaves a
// cookie for its own requests; a Bearer header works for scripts.
func TestToken(t *testing.T) {
	s := &Server{Token: "s3cret", Collect: func(context.Context) (*top.Snapshot, error) { return &top.Snapshot{}, nil }}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	do := func(path string, edit func(*http.Request)) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(req)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for _, path := range []string{"/", "/api/snapshot", "/?token=wrong"} {
		if resp, body := do(path, nil); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "open the link the command printed") {
			t.Errorf("GET %s without the token: %d %q", path, resp.StatusCode, body)
		}
	}
	resp, _ := do("/?token=s3cret", nil)
	if resp.StatusCode != http.StatusOK || len(resp.Cookies()) != 1 || !resp.Cookies()[0].HttpOnly {
		t.Fatalf("the printed link: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	cookie := resp.Cookies()[0]
	if resp, body := do("/api/snapshot", func(r *http.Request) { r.AddCookie(cookie) }); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"taken"`) {
		t.Errorf("the page's own request with the cookie: %d %q", resp.StatusCode, body)
	}
	if resp, _ := do("/api/snapshot", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") }); resp.StatusCode != http.StatusOK {
		t.Errorf("Bearer: %d", resp.StatusCode)
	}
}
