package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"net/http/httptest"

	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/podgpu"
	"github.com/tessera-gpu/tessera/pkg/top"
	"github.com/tessera-gpu/tessera/pkg/top/web"
)

// chromium finds Debian's chromium (make test installs it when missing).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH: `make test` installs Debian's chromium package (as root); apt-get install chromium")
	return ""
}

// TestWebViewInHeadlessChromium: `tessera top --web` on a playground
// running the demo workload, read as a user allowed only get and list on
// pods and nodes, shows every demo pod's slice on the GPU its assignment
// names, and, without a reload, drops a pod's tile once it is deleted.
// TESSERA_WEB_SCREENSHOT=file.png keeps a screenshot (make web-screenshot).
func TestWebViewInHeadlessChromium(t *testing.T) {
	browser := chromium(t)
	c, _ := up(t, playground.Options{Nodes: 4, GPUsPerNode: 8, Model: "h100", MPSNodes: 2})
	ctx := context.Background()
	if err := playground.Submit(ctx, c.Client, playground.DemoNamespace, playground.DemoWorkload()); err != nil {
		t.Fatal(err)
	}
	if _, err := playground.WaitSettled(ctx, c.Client, playground.DemoNamespace, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	// A viewer: get and list on pods and nodes, nothing else.
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gpu-viewer"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "nodes"}, Verbs: []string{"get", "list"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gpu-viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gpu-viewer"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "viewer"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "viewer"}
	viewer := kubernetes.NewForConfigOrDie(cfg)
	if _, err := viewer.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); err == nil {
		t.Fatal("the viewer may list secrets; the test would prove nothing")
	}

	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, n.MetricsURL)
	}
	collectErrs := make(chan error, 100)
	srv := httptest.NewServer((&web.Server{Every: 300 * time.Millisecond, Collect: func(ctx context.Context) (*top.Snapshot, error) {
		snap, err := top.Collect(ctx, viewer)
		if err != nil {
			select {
			case collectErrs <- err:
			default:
			}
			return nil, err
		}
		for _, u := range urls {
			_ = snap.AddUsage(ctx, u)
		}
		return snap, nil
	}}).Handler())
	defer srv.Close()

	// Where each demo pod's slices are, by its assignment.
	want := map[string][]string{}
	pods, err := c.Client.CoreV1().Pods(playground.DemoNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		a, err := podgpu.BoundAssignment(p)
		if err != nil || a == nil {
			t.Fatalf("demo pod %s has no assignment: %v", p.Name, err)
		}
		for _, ctr := range a.Containers {
			for _, g := range ctr.GPUs {
				want[p.Namespace+"/"+p.Name] = append(want[p.Namespace+"/"+p.Name], a.Node+"/"+strconv.Itoa(g.Index))
			}
		}
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.Flag("headless", true), chromedp.WindowSize(1600, 1400), chromedp.UserDataDir(t.TempDir()))
	actx, cancel := chromedp.NewExecAllocator(ctx, opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	bctx, cancel = context.WithTimeout(bctx, 90*time.Second)
	defer cancel()

	type tile struct {
		Pod  string `json:"pod"`
		GPU  string `json:"gpu"`
		Mode string `json:"mode"`
	}
	if err := chromedp.Do(bctx, chromedp.Navigate(srv.URL), chromedp.WaitVisible(`[data-pod="demo/train-whole-0"]`)); err != nil {
		t.Fatalf("the page did not show the demo: %v", err)
	}
	tiles, err := chromedp.Run(bctx, chromedp.Evaluate[[]tile](`Array.from(document.querySelectorAll('[data-pod]')).map(e => ({pod: e.dataset.pod, gpu: e.closest('[data-gpu]').dataset.gpu, mode: e.closest('[data-gpu]').dataset.mode}))`))
	if err != nil {
		t.Fatal(err)
	}
	fragmentation, err := chromedp.Run(bctx, chromedp.Text(`#fragmentation`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, tl := range tiles {
		got[tl.Pod] = append(got[tl.Pod], tl.GPU)
	}
	for pod, gpus := range want {
		sort.Strings(gpus)
		have := got[pod]
		sort.Strings(have)
		if strings.Join(have, ",") != strings.Join(gpus, ",") {
			t.Errorf("%s: tiles on %v, its assignment says %v", pod, have, gpus)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d pods on the page, %d demo pods", len(got), len(want))
	}
	if !strings.Contains(fragmentation, "fragmented:") || !strings.Contains(fragmentation, "free GPUs") {
		t.Errorf("fragmentation figure %q", fragmentation)
	}
	t.Logf("%d tiles for %d pods; %s", len(tiles), len(got), fragmentation)

	if path := os.Getenv("TESSERA_WEB_SCREENSHOT"); path != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}

	// A deleted pod leaves the page without a reload.
	start := time.Now()
	if err := c.Client.CoreV1().Pods(playground.DemoNamespace).Delete(ctx, "infer-ts-0", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, chromedp.WaitNotPresent(`[data-pod="demo/infer-ts-0"]`), chromedp.WaitVisible(`[data-pod="demo/infer-ts-1"]`)); err != nil {
		t.Fatalf("the deleted pod stayed on the page: %v", err)
	}
	t.Logf("deleted pod gone from the page %v after its deletion", time.Since(start).Round(time.Millisecond))
	select {
	case err := <-collectErrs:
		t.Errorf("reading as the viewer failed: %v", err)
	default:
	}
}
