// Package allocator is Tessera's placement core: given a node's GPUs and what is
// already placed on them, and a pod's request, it decides whether the pod fits,
// on which GPUs, with which memory and compute slice and sharing mode, and how
// good that placement is under the configured scoring policy.
//
// The scheduler plugin and the trace simulator both call it, so a packing
// result measured in `tessera sim` is what the cluster gets.
//
// Rules it enforces (DESIGN.md, invariants 1 and 2):
//   - a request without memory and cores gets whole GPUs, exclusively;
//   - a sharing request gets a fragment of a GPU: MPS on MPS-capable GPUs when
//     the pod lets it (auto or mps), time-slicing elsewhere; a GPU runs one mode;
//   - per GPU, Σ memory ≤ capacity × oversubscription and Σ cores ≤ 100 %;
//   - the minimum slice of the workload class, GPU model allow-lists, healthy
//     GPUs only, and the node's CPU and memory.
//
// It does no I/O, keeps no clock and no randomness: the same input gives the
// same output. It must not import Kubernetes.
package allocator
