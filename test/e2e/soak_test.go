package e2e

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/pkg/playground"
	"github.com/tessera-gpu/tessera/pkg/soak"
)

// TestShortSoak: about 1,000 events of churn and faults on a playground
// with a DRA node beside device-plugin nodes, the invariants checked after
// every step (the short soak of `make
// test`; `make soak` runs 10,000, with nodes removed and re-added too).
// TESSERA_SOAK_SEED replays another seed.
func TestShortSoak(t *testing.T) {
	seed := uint64(1)
	if s := os.Getenv("TESSERA_SOAK_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TESSERA_SOAK_SEED=%q: %v", s, err)
		}
		seed = v
	}
	// The fourth node serves DRA: a third of the pods ask with a
	// ResourceClaim, placed and preempted by TesseraGPU there.
	c, _ := up(t, playground.Options{Nodes: 4, GPUsPerNode: 4, Model: "h100", MPSNodes: 1, DRANodes: 1, QuietPeriod: 3 * time.Second, SchedulerReplicas: 2,
		FastSliceAdjuster: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var log strings.Builder
	sum, err := soak.Run(ctx, c, soak.Options{Seed: seed, Events: 1000, FaultEvery: 30, Step: 20 * time.Millisecond, Bound: 45 * time.Second,
		// Open (issue 19): under make test's load the scheduler's series
		// were seen showing slices booked with every pod gone; reported in
		// the log, not yet a failure.
		KnownOpen: []string{soak.NothingBooked}}, &log)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sum.Render(&out)
	t.Logf("\n%s%s", log.String(), out.String())
	if len(sum.KnownOpen) > 0 {
		t.Logf("known and open (issue 19), not failing: %d", len(sum.KnownOpen))
	}
	if len(sum.Violations) > 0 {
		t.Errorf("%d violation(s); replay with TESSERA_SOAK_SEED=%d", len(sum.Violations), seed)
	}
	if total := sum.Events["create"]; total < 300 {
		t.Errorf("only %d pods created", total)
	}
	if claims := sum.Observed["pod asking with a ResourceClaim"]; claims < 60 {
		t.Errorf("only %d pods asked with a ResourceClaim", claims)
	}
	faults := 0
	for _, n := range sum.Faults {
		faults += n
	}
	if faults < 10 {
		t.Errorf("only %d faults injected", faults)
	}
}
