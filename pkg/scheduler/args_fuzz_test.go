package scheduler

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

// FuzzDecodeArgs: whatever a KubeSchedulerConfiguration's pluginConfig
// holds for TesseraGPU, as YAML or JSON, decoding never panics; what it
// accepts is a configuration Validate accepts, within the documented
// bounds; what it refuses, it refuses naming the plugin's arguments.
func FuzzDecodeArgs(f *testing.F) {
	for _, s := range []string{
		"policy: binpack\nmemoryOversubscription: 1.2\n",
		"policy: tessera\nworkloadCoverage: 0.95\nminSliceMiB: {training: 8192, inference: 4096}\npreemption: {gracePeriod: 30s, recordRetention: 10, reclaimTimeout: 2m}\n",
		`{"policy":"fgd","computeOversubscription":1}`,
		"memoryOversubscription: 2\n",
		"unknown: 1\n",
		"null",
		"",
		"policy: [",
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, raw []byte, yaml bool) {
		u := &runtime.Unknown{Raw: raw, ContentType: runtime.ContentTypeJSON}
		if yaml {
			u.ContentType = runtime.ContentTypeYAML
		}
		c, err := decodeArgs(u)
		if err != nil {
			if !strings.Contains(err.Error(), "pluginConfig[TesseraGPU].args") {
				t.Fatalf("an error that does not name the plugin's arguments: %v", err)
			}
			return
		}
		if err := config.Validate(c); err != nil {
			t.Fatalf("accepted arguments that do not validate: %v", err)
		}
		a := c.Allocator
		if a.MemoryOversubscription < 1 || a.MemoryOversubscription > 1.5 || a.ComputeOversubscription != 1 ||
			a.WorkloadCoverage <= 0 || a.WorkloadCoverage > 1 {
			t.Fatalf("accepted out-of-range arguments: %+v", a)
		}
	})
}
