package nvml

import (
	"context"
	"errors"
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Event is one NVML event on one GPU.
type Event struct {
	UUID string
	// Type is the NVML event type (gonvml.EventTypeXidCriticalError, ...).
	Type uint64
	// Xid is the XID code of an XID critical error, 0 otherwise.
	Xid uint64
}

// watchedEvents are the events that can take a GPU out of service.
const watchedEvents = gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError

// waitMillis bounds one EventSetWait, so WatchEvents notices ctx promptly.
const waitMillis = 500

// WatchEvents registers every GPU for XID critical errors and double-bit ECC
// errors and calls fn with each event until ctx is done. A GPU that supports
// none of them is skipped (and named in the returned error only if no GPU
// could be watched at all).
func (c *Client) WatchEvents(ctx context.Context, fn func(Event)) error {
	set, ret := c.lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("NVML event set: %s", errorString(c.lib, ret))
	}
	defer set.Free()
	watched := 0
	err := c.eachDevice(func(i int, d gonvml.Device) error {
		supported, ret := d.GetSupportedEventTypes()
		if ret != gonvml.SUCCESS {
			return fmt.Errorf("event types: %s", errorString(c.lib, ret))
		}
		if supported&watchedEvents == 0 {
			return errors.New("supports neither XID nor ECC events")
		}
		if ret := d.RegisterEvents(supported&watchedEvents, set); ret != gonvml.SUCCESS {
			return fmt.Errorf("register events: %s", errorString(c.lib, ret))
		}
		watched++
		return nil
	})
	if watched == 0 && err != nil {
		return fmt.Errorf("no GPU can be watched for faults: %w", err)
	}
	for ctx.Err() == nil {
		data, ret := set.Wait(waitMillis)
		switch ret {
		case gonvml.SUCCESS:
		case gonvml.ERROR_TIMEOUT:
			continue
		default:
			return fmt.Errorf("NVML event wait: %s", errorString(c.lib, ret))
		}
		ev := Event{Type: data.EventType}
		if data.EventType == gonvml.EventTypeXidCriticalError {
			ev.Xid = data.EventData
		}
		if data.Device != nil {
			ev.UUID, _ = data.Device.GetUUID()
		}
		fn(ev)
	}
	return nil
}
