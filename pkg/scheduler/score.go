package scheduler

import (
	"context"
	"math"
	"time"

	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// PreScore skips scoring for pods without GPUs.
func (p *Plugin) PreScore(_ context.Context, state fwk.CycleState, _ *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	if readState(state) == nil && readClaims(state) == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	return nil
}

// scoreScale keeps the allocator's fractional scores distinct as integers.
const scoreScale = 1e6

// Score is the allocator's score of the node under the configured policy:
// the memo Filter filled answers it without placing again, unless the node
// changed in between (a binding completed, a pod left) or the workload did,
// when it is placed afresh. Reserve places once more under the node's lock, so a ranking that
// moved never books anything stale.
//
// A pod's gpu.tessera.dev claim adds the gradient's score of its best GPU
// on the node (claims.go); a node where it fits no GPU by the scheduler's
// account ranks last.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	s := readState(state)
	var claimScore int64
	if s == nil || s.claims {
		if c := readClaims(state); c != nil && c.scores != nil {
			score, ok := c.scores[nodeInfo.Node().Name]
			if !ok {
				return math.MinInt64 / 2, nil
			}
			claimScore = int64(math.Round(score * scoreScale))
		}
	}
	if s == nil {
		return claimScore, nil
	}
	if s.timed {
		defer observeSince(scoreDuration, time.Now())
	}
	reason, score, err := p.cache.ScoreNode(s.alloc, nodeInfo.Node(), s.shape, s.req)
	if err != nil || !reason.OK() {
		return math.MinInt64 / 2, nil // changed since Filter; rank it last
	}
	return int64(math.Round(score*scoreScale)) + claimScore, nil
}

// ScoreExtensions returns the plugin, which normalizes its own scores.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return p }

// NormalizeScore maps scores onto 0–100 so that the allocator's best nodes,
// and only they, get 100: linear scaling alone could round a runner-up into a
// tie with the best, and the framework breaks ties at random.
func (p *Plugin) NormalizeScore(_ context.Context, _ fwk.CycleState, _ *v1.Pod, scores fwk.NodeScoreList) *fwk.Status {
	if len(scores) == 0 {
		return nil
	}
	lo, hi := scores[0].Score, scores[0].Score
	for _, s := range scores {
		lo, hi = min(lo, s.Score), max(hi, s.Score)
	}
	for i := range scores {
		switch {
		case scores[i].Score == hi:
			scores[i].Score = fwk.MaxNodeScore
		default:
			scores[i].Score = int64(float64(scores[i].Score-lo) / float64(hi-lo) * float64(fwk.MaxNodeScore-1))
		}
	}
	return nil
}
