// Package web serves `tessera top --web`: a page drawing every node's GPUs
// as a grid, each GPU's slices as tiles sized by their grant and coloured by
// mode, from the same snapshot as `tessera top` (pkg/top). The page's
// assets are embedded, so it works without a network; it polls
// /api/snapshot, which the server answers from a snapshot at most Every
// old, so many open pages cost the API server one read per interval.
package web

import (
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/pkg/top"
)

//go:embed assets
var assets embed.FS

// Server serves the page and its data.
type Server struct {
	// Collect reads the cluster: top.Collect and the agents' usage.
	Collect func(ctx context.Context) (*top.Snapshot, error)
	// Every is how old a snapshot may be before a request reads anew, and
	// how often the page asks; 2 s when zero.
	Every time.Duration
	// Token, when set, is asked of every request: as ?token= (the link the
	// command prints, which also leaves a cookie for the page's own
	// requests), the cookie, or an Authorization: Bearer header. The page
	// shows every tenant's pods and usage.
	Token string

	mu   sync.Mutex
	last *View
}

// View is what /api/snapshot returns.
type View struct {
	*top.Snapshot
	// Taken is when the snapshot was read.
	Taken time.Time `json:"taken"`
	// Error is why the last read failed; the snapshot is then the last
	// good one (or none), so the page says it is stale.
	Error string `json:"error,omitempty"`
	// RefreshMillis is how often the page asks again.
	RefreshMillis int64 `json:"refreshMillis"`
	// FragmentationRatio is Fragmentation.Ratio(), for the page.
	FragmentationRatio float64 `json:"fragmentationRatio"`
}

func (s *Server) every() time.Duration {
	if s.Every <= 0 {
		return 2 * time.Second
	}
	return s.Every
}

// view returns a snapshot at most Every old, reading one when needed; one
// read at a time.
func (s *Server) view(ctx context.Context) *View {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil && time.Since(s.last.Taken) < s.every() {
		return s.last
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	snap, err := s.Collect(ctx)
	v := &View{Taken: time.Now(), RefreshMillis: s.every().Milliseconds()}
	switch {
	case err == nil:
		v.Snapshot = snap
		v.FragmentationRatio = snap.Fragmentation.Ratio()
	case s.last != nil && s.last.Snapshot != nil:
		klog.FromContext(ctx).Error(err, "Reading the cluster failed; the page shows the last snapshot")
		v.Snapshot, v.FragmentationRatio, v.Taken = s.last.Snapshot, s.last.FragmentationRatio, s.last.Taken
		v.Error = err.Error()
	default:
		v.Snapshot = &top.Snapshot{}
		v.Error = err.Error()
	}
	s.last = v
	return v
}

// tokenCookie carries the token for the page's own requests.
const tokenCookie = "tessera-web-token"

// Handler serves the page at / and its data at /api/snapshot, behind the
// token when one is set.
func (s *Server) Handler() http.Handler {
	h := s.handler()
	if s.Token == "" {
		return h
	}
	want := []byte(s.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		given := r.URL.Query().Get("token")
		fromQuery := given != ""
		if c, err := r.Cookie(tokenCookie); !fromQuery && err == nil {
			given = c.Value
		}
		if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); given == "" && ok {
			given = b
		}
		if subtle.ConstantTimeCompare([]byte(given), want) != 1 {
			http.Error(w, "tessera top --web: this view needs its token: open the link the command printed (…/?token=…)", http.StatusUnauthorized)
			return
		}
		if fromQuery {
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: given, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "assets")
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/snapshot", func(w http.ResponseWriter, r *http.Request) {
		v := s.view(r.Context())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(v)
	})
	return mux
}
