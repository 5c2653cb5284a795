package gpu

import "strconv"

// SeriesLabels are the labels of every per-GPU metric series Tessera
// exports, agent and scheduler alike, named as NVIDIA's DCGM exporter names
// them so the two join without relabelling: gpu is the NVML index, UUID the
// GPU's UUID, modelName its model. node is the Kubernetes node (DCGM's
// Hostname is the exporter pod's host name, which is the node only with
// hostNetwork). Join across nodes on UUID, or on node and gpu.
var SeriesLabels = []string{"node", "gpu", "UUID", "modelName"}

// SeriesLabelValues are SeriesLabels' values for one GPU, in their order.
func SeriesLabelValues(node string, index int, uuid, model string) []string {
	return []string{node, strconv.Itoa(index), uuid, model}
}

// TenantSeriesLabels are SeriesLabels and the container's own, as DCGM
// exporter names them with its Kubernetes mapping on.
var TenantSeriesLabels = append(append([]string{}, SeriesLabels...), "namespace", "pod", "container")
