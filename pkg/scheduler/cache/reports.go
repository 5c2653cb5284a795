package cache

import (
	"context"

	"github.com/tessera-gpu/tessera/pkg/allocator"
)

// notify reports a node change. It runs under c.mu (callers hold it), which
// keeps metric updates in the order of the changes; the callback must not
// call back into the cache.
func (c *Cache) notify(name string, snap *allocator.Node) {
	if c.reporting() && c.onNodeChange != nil {
		c.onNodeChange(name, snap)
	}
}

// ReportUntil sends the cache's node changes to change and gone, in their
// order, until ctx ends. A cache whose scheduler stopped must not write the
// process's series any more: in one process (the playground, tessera up, the
// soak) a restarted scheduler's new cache reports the same GPUs, and the
// stopped one's last cycle still in flight — a Reserve, the Unreserve of a
// bind its stop cancelled, a reclaim expiring — would overwrite them with a
// frozen view whose pods nobody deletes from it any more: the soak saw the
// series keep slices booked with every pod gone.
func (c *Cache) ReportUntil(ctx context.Context, change func(string, *allocator.Node), gone func(string, []allocator.GPU)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reportCtx, c.onNodeChange, c.onNodeGone = ctx, change, gone
}

// reporting says whether changes are reported; callers hold mu.
func (c *Cache) reporting() bool { return c.reportCtx != nil && c.reportCtx.Err() == nil }

// Reporting says whether the cache's scheduler still runs, so that its view
// may be exported.
func (c *Cache) Reporting() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.reporting()
}
