package scheduler

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

func TestDecodeArgs(t *testing.T) {
	got, err := DecodeArgs(&runtime.Unknown{Raw: []byte("policy: binpack\nmemoryOversubscription: 1.2\n"), ContentType: runtime.ContentTypeYAML})
	if err != nil {
		t.Fatal(err)
	}
	if got.Policy != config.PolicyBinpack || got.MemoryOversubscription != 1.2 || got.MinSliceMiB.Training != 8192 {
		t.Errorf("decoded %+v", got)
	}
	if got, err := DecodeArgs(nil); err != nil || got.Policy != config.DefaultPolicy {
		t.Errorf("no args: %+v, %v", got, err)
	}
	_, err = DecodeArgs(&runtime.Unknown{Raw: []byte(`{"policy":"x","memoryOversubscription":3}`)})
	for _, want := range []string{"pluginConfig[TesseraGPU].args.policy", "pluginConfig[TesseraGPU].args.memoryOversubscription"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to name %s", err, want)
		}
	}
	// A value written as 0 is refused by its name, not replaced by the
	// default (recordRetention: 0 used to become 100).
	for raw, want := range map[string]string{
		`{"preemption":{"recordRetention":0}}`: "pluginConfig[TesseraGPU].args.preemption.recordRetention: invalid value 0",
		`{"memoryOversubscription":0}`:         "pluginConfig[TesseraGPU].args.memoryOversubscription: invalid value 0",
		`{"minSliceMiB":{"training":0}}`:       "pluginConfig[TesseraGPU].args.minSliceMiB.training: invalid value 0",
	} {
		if _, err := DecodeArgs(&runtime.Unknown{Raw: []byte(raw)}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", raw, err, want)
		}
	}
	if c, err := decodeArgs(&runtime.Unknown{Raw: []byte(`{"preemption":{"gracePeriod":"10s"}}`)}); err != nil ||
		c.Preemption.GracePeriod.Duration != 10*time.Second || c.Preemption.RecordRetention != config.DefaultRecordRetention {
		t.Errorf("a preemption section with one field: %+v, %v", c, err)
	}
}
