package playground

import (
	"strings"
	"testing"
	"time"
)

func TestSchedulerConfigReclaimTimeout(t *testing.T) {
	for _, tc := range []struct {
		timeout time.Duration
		want    string
	}{
		{0, "reclaimTimeout: 2m\n"}, // the shipped value
		{3 * time.Second, "reclaimTimeout: 3s\n"},
		{90 * time.Second, "reclaimTimeout: 1m30s\n"},
	} {
		cfg, err := schedulerConfig("/k", tc.timeout)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(cfg, "reclaimTimeout:") != 1 || !strings.Contains(cfg, tc.want) {
			t.Errorf("timeout %v: configuration lacks %q:\n%s", tc.timeout, tc.want, cfg)
		}
	}
	if err := (Options{Nodes: 1, GPUsPerNode: 1, Model: "h100", ReclaimTimeout: -time.Second}).Validate(); err == nil ||
		!strings.Contains(err.Error(), "reclaim timeout -1s") {
		t.Errorf("a negative reclaim timeout: %v, want it refused by name", err)
	}
}
