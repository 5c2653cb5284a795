package scheduler

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/pkg/apis/config"
)

// argsField is how errors name the plugin's arguments in a
// KubeSchedulerConfiguration.
const argsField = "pluginConfig[" + Name + "].args"

// DecodeArgs reads the plugin's arguments — the allocator section of Tessera's
// configuration (policy, memoryOversubscription, computeOversubscription,
// minSliceMiB, workloadCoverage) and its preemption section (preemption:
// gracePeriod, recordRetention, reclaimTimeout) — from a
// KubeSchedulerConfiguration's pluginConfig. Unknown fields are refused,
// missing ones take the production defaults, and every invalid value is
// reported with its field path, for example
// "pluginConfig[TesseraGPU].args.memoryOversubscription".
func DecodeArgs(obj runtime.Object) (*config.AllocatorConfig, error) {
	c, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	return &c.Allocator, nil
}

// pluginArgs is the shape of the plugin's arguments: the allocator's fields
// at the top, as they always were, and the preemption section beside them.
type pluginArgs struct {
	config.AllocatorInput
	Preemption *config.PreemptionInput `json:"preemption"`
}

func decodeArgs(obj runtime.Object) (*config.Configuration, error) {
	var args pluginArgs
	if obj != nil {
		u, ok := obj.(*runtime.Unknown)
		if !ok {
			return nil, fmt.Errorf("%s: want the plugin's arguments as raw YAML or JSON, got %T", argsField, obj)
		}
		raw := u.Raw
		if u.ContentType == runtime.ContentTypeYAML {
			js, err := yaml.YAMLToJSON(raw)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", argsField, err)
			}
			raw = js
		}
		if len(bytes.TrimSpace(raw)) > 0 && string(bytes.TrimSpace(raw)) != "null" {
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&args); err != nil {
				return nil, fmt.Errorf("%s: %w", argsField, err)
			}
		}
	}
	// A field left out takes its default; one written as 0 is validated as 0.
	c := config.Sections(&args.AllocatorInput, args.Preemption)
	if err := config.Validate(c); err != nil {
		return nil, renameFields(err)
	}
	return c, nil
}

// renameFields rewrites the config package's field paths ("allocator.policy")
// into the paths a scheduler operator edits.
func renameFields(err error) error {
	var joined interface{ Unwrap() []error }
	errs := []error{err}
	if errors.As(err, &joined) {
		errs = joined.Unwrap()
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		var fe *config.FieldError
		if errors.As(e, &fe) {
			f := *fe
			f.Field = argsField + "." + strings.TrimPrefix(f.Field, "allocator.")
			out = append(out, &f)
			continue
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}
