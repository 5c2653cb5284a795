package gpu

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// CodecVersion is the version written into every encoded object. It changes only
// for a change an older reader cannot safely skip (a field whose meaning changes, a
// new sharing mode that must not be read as another); decoders refuse a version
// they do not know, loudly. Additions an older reader may ignore (a new optional
// field at any level) keep the version: decoders skip fields they do not know, so
// tessera-scheduler and the agents can be upgraded in either order across one
// minor release (testdata/skew holds what each side writes).
const CodecVersion = "v1"

// MaxEncodedBytes bounds what the decoders read. Kubernetes caps all of a pod's
// annotations at 256 KiB together; anything near that is not ours.
const MaxEncodedBytes = 64 << 10

type assignmentEnvelope struct {
	Version string `json:"v"`
	PodAssignment
}

type inventoryEnvelope struct {
	Version string `json:"v"`
	NodeInventory
}

// EncodeAssignment renders a validated assignment as the value of the
// tessera.dev/assignment annotation.
func EncodeAssignment(a *PodAssignment) (string, error) {
	if err := a.Validate(); err != nil {
		return "", err
	}
	b, err := json.Marshal(assignmentEnvelope{Version: CodecVersion, PodAssignment: *a})
	if err != nil {
		return "", fmt.Errorf("encoding assignment: %w", err)
	}
	return string(b), nil
}

// DecodeAssignment parses and validates a tessera.dev/assignment value.
func DecodeAssignment(s string) (*PodAssignment, error) {
	var env assignmentEnvelope
	if err := decodeBounded(s, &env); err != nil {
		return nil, fmt.Errorf("%s: %w", AnnotationAssignment, err)
	}
	if env.Version != CodecVersion {
		return nil, invalidf("%s: version %q, this build reads %q", AnnotationAssignment, env.Version, CodecVersion)
	}
	if err := env.PodAssignment.Validate(); err != nil {
		return nil, err
	}
	return &env.PodAssignment, nil
}

// EncodeInventory renders a validated node inventory for publication.
func EncodeInventory(n *NodeInventory) ([]byte, error) {
	if err := n.Validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(inventoryEnvelope{Version: CodecVersion, NodeInventory: *n})
	if err != nil {
		return nil, fmt.Errorf("encoding inventory: %w", err)
	}
	return b, nil
}

// DecodeInventory parses and validates a published node inventory.
func DecodeInventory(b []byte) (*NodeInventory, error) {
	var env inventoryEnvelope
	if err := decodeBounded(string(b), &env); err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	if env.Version != CodecVersion {
		return nil, invalidf("inventory: version %q, this build reads %q", env.Version, CodecVersion)
	}
	if err := env.NodeInventory.Validate(); err != nil {
		return nil, err
	}
	return &env.NodeInventory, nil
}

func decodeBounded(s string, v any) error {
	if len(s) > MaxEncodedBytes {
		return invalidf("%d bytes, more than the %d allowed", len(s), MaxEncodedBytes)
	}
	// No DisallowUnknownFields: see CodecVersion.
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalidf("trailing data after the JSON object")
	}
	return nil
}
