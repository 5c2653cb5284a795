package allocator

import "math/bits"

// consolidate is the bonus, below one step of nodeScore, that the tessera
// policy gives a sharing pod for a node that already shares a GPU.
const consolidate = 1e-3

// tesseraScore is Tessera's own policy: FGD's fragmentation gradient at the
// same resolution (nodeScore), and among placements that FGD rates equal, a
// sharing pod goes to a node that already runs sharing pods.
//
// Why: sharing pods leave slivers (an 810‰ pod leaves 190‰ that only small pods
// can use). Keeping them on the nodes that already share keeps the other nodes'
// GPUs whole for whole-GPU and multi-GPU pods, and gives small pods more
// slivers to fill. FGD's gradient alone does not see it, because a sliver on a
// shared node and a fresh GPU elsewhere can cost the same expected fragmentation.
func (a *Allocator) tesseraScore(n *Node, st *fragState, after *[MaxGPUsPerNode]usage, changed uint64, cpuFree, memFree int64) float64 {
	s := nodeScore(a.workload.reduction(n, st, after, changed, cpuFree, memFree, a.oversub))
	if st.shared && sharingPlacement(after, changed) {
		s += consolidate
	}
	return s
}

// sharingPlacement reports whether the placement puts a sharing slice anywhere.
func sharingPlacement(after *[MaxGPUsPerNode]usage, changed uint64) bool {
	for c := changed; c != 0; c &= c - 1 {
		if m := after[bits.TrailingZeros64(c)].mode; m == modeMPS || m == modeTimeSlicing {
			return true
		}
	}
	return false
}
