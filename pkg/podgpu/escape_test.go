package podgpu

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestEscapesSlice(t *testing.T) {
	base := func() *v1.Pod { return &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main"}}}} }
	for _, tc := range []struct {
		name   string
		change func(p *v1.Pod)
		want   []string
	}{
		{"a plain pod", func(*v1.Pod) {}, nil},
		{"privileged", func(p *v1.Pod) { p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Privileged: ptr.To(true)} },
			[]string{"container main is privileged (it sees every GPU of the node)"}},
		{"a privileged init container", func(p *v1.Pod) {
			p.Spec.InitContainers = []v1.Container{{Name: "init", SecurityContext: &v1.SecurityContext{Privileged: ptr.To(true)}}}
		}, []string{"container init is privileged (it sees every GPU of the node)"}},
		{"host namespaces", func(p *v1.Pod) { p.Spec.HostPID, p.Spec.HostNetwork = true, true },
			[]string{"the pod sets hostNetwork", "the pod sets hostPID"}},
		{"the GPUs' variables", func(p *v1.Pod) {
			p.Spec.Containers[0].Env = []v1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}, {Name: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}, {Name: "APP_MODE"}}
		}, []string{"container main sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "container main sets NVIDIA_VISIBLE_DEVICES"}},
		{"envFrom with and without a safe prefix", func(p *v1.Pod) {
			p.Spec.Containers[0].EnvFrom = []v1.EnvFromSource{{Prefix: "APP_"}, {}}
		}, []string{`container main uses envFrom without a safe prefix ("")`}},
		{"capabilities", func(p *v1.Pod) {
			p.Spec.Containers[0].SecurityContext = &v1.SecurityContext{Capabilities: &v1.Capabilities{Add: []v1.Capability{"NET_BIND_SERVICE", "cap_sys_admin"}}}
		}, []string{"container main adds capability SYS_ADMIN"}},
		{"host paths", func(p *v1.Pod) {
			for _, path := range []string{"/data/models", "/var/run/cdi", "/dev", "/dev/nvidia0", "/var/lib/kubelet/plugins/gpu.tessera.dev", "/data/../run/tessera", "/"} {
				p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: path}}})
			}
		}, []string{"the pod mounts host path /", "the pod mounts host path /data/../run/tessera", "the pod mounts host path /dev",
			"the pod mounts host path /dev/nvidia0", "the pod mounts host path /var/lib/kubelet/plugins/gpu.tessera.dev", "the pod mounts host path /var/run/cdi"}},
	} {
		p := base()
		tc.change(p)
		if got := EscapesSlice(p); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
