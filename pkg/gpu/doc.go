// Package gpu holds Tessera's domain types — devices, node inventories, requests
// and assignments — and the codecs that store them in annotations and on the API
// server.
//
// It is imported by every other package, so it must stay small: no I/O, no
// Kubernetes client code, no placement logic (that is pkg/allocator's job).
package gpu
