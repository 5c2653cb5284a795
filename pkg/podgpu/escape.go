package podgpu

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// EscapesSlice lists what in a pod would let it leave the slice a claim
// gives it: the admission policy tessera-gpu-pod-limits refuses the same
// in pods that ask for tessera.dev resources, but a pod holding a claim
// names only the claim, whose driver a policy cannot see. The claim
// admission webhook (pkg/claimadmission), which reads the claims, refuses
// such a pod holding a gpu.tessera.dev claim, and the DRA driver refuses
// to prepare the claim for it (the webhook fails open). The operator's
// host-path allow-list (a ConfigMap the policy reads) is not applied here:
// only the paths no GPU pod may ever mount.
func EscapesSlice(p *v1.Pod) []string {
	var out []string
	var containers []v1.Container
	containers = append(containers, p.Spec.InitContainers...)
	containers = append(containers, p.Spec.Containers...)
	for _, e := range p.Spec.EphemeralContainers {
		containers = append(containers, v1.Container(e.EphemeralContainerCommon))
	}
	for _, c := range containers {
		if sc := c.SecurityContext; sc != nil {
			if sc.Privileged != nil && *sc.Privileged {
				out = append(out, fmt.Sprintf("container %s is privileged (it sees every GPU of the node)", c.Name))
			}
			if sc.Capabilities != nil {
				for _, k := range sc.Capabilities.Add {
					name := strings.TrimPrefix(strings.ToUpper(string(k)), "CAP_")
					if !slices.Contains(defaultCapabilities, name) {
						out = append(out, fmt.Sprintf("container %s adds capability %s", c.Name, name))
					}
				}
			}
		}
		for _, e := range c.Env {
			if guardedEnv(e.Name) {
				out = append(out, fmt.Sprintf("container %s sets %s", c.Name, e.Name))
			}
		}
		for _, f := range c.EnvFrom {
			if unsafePrefix(f.Prefix) {
				out = append(out, fmt.Sprintf("container %s uses envFrom without a safe prefix (%q)", c.Name, f.Prefix))
			}
		}
	}
	for name, on := range map[string]bool{"hostPID": p.Spec.HostPID, "hostIPC": p.Spec.HostIPC, "hostNetwork": p.Spec.HostNetwork} {
		if on {
			out = append(out, "the pod sets "+name)
		}
	}
	for _, v := range p.Spec.Volumes {
		if v.HostPath != nil && guardedPath(v.HostPath.Path) {
			out = append(out, "the pod mounts host path "+v.HostPath.Path)
		}
	}
	slices.Sort(out) // the map above has no order
	return out
}

// defaultCapabilities are the container runtime's defaults (Pod Security's
// baseline list), as the admission policy has them.
var defaultCapabilities = []string{"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
	"SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}

// guardedEnvPrefixes carry the GPUs and limits a claim's CDI spec sets.
var guardedEnvPrefixes = []string{"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_", "TESSERA_"}

func guardedEnv(name string) bool {
	return name == "NVIDIA_VISIBLE_DEVICES" || name == "CUDA_VISIBLE_DEVICES" || strings.HasPrefix(name, "CUDA_MPS_") || strings.HasPrefix(name, "TESSERA_")
}

// unsafePrefix: an envFrom prefix under which a ConfigMap or Secret key
// could still be a guarded name.
func unsafePrefix(prefix string) bool {
	for _, g := range guardedEnvPrefixes {
		if strings.HasPrefix(g, prefix) || strings.HasPrefix(prefix, "CUDA_MPS_") || strings.HasPrefix(prefix, "TESSERA_") {
			return true
		}
	}
	return false
}

// guardedHostPaths are what no GPU tenant may mount: the agent's and
// kubelet's directories, CDI specs, and (with /dev/nvidia*) the devices.
var guardedHostPaths = []string{"/run/tessera", "/var/run/tessera", "/run/cdi", "/var/run/cdi", "/etc/cdi",
	"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry"}

// guardedPath is a host path at, above or below a guarded one, the root,
// a GPU device, or one not written plainly (//, /./, /../, a trailing /),
// which string comparison cannot judge.
func guardedPath(p string) bool {
	if p == "/" || !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || strings.Contains(p, "//") ||
		strings.Contains(p+"/", "/./") || strings.Contains(p+"/", "/../") {
		return true
	}
	if strings.HasPrefix(p, "/dev/nvidia") || strings.HasPrefix("/dev/nvidia", p+"/") {
		return true
	}
	for _, g := range guardedHostPaths {
		if p == g || strings.HasPrefix(p, g+"/") || strings.HasPrefix(g, p+"/") {
			return true
		}
	}
	return false
}
