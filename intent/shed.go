package intent

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Admission bounds: load shedding at the door. A gateway at capacity that queues without
// bound turns a backlog longer than the clients' deadline into a total outage (row 18's soak:
// ~600 jobs queued, every client 504 after 30 s). So a new execution is refused at once,
// before anything is written, when this node already has MaxExecutions of its own in flight
// or the job at the head of the JOBS queue has waited longer than MaxQueueWait; the client
// gets a 503 with Retry-After and comes back when there is room. Copies of existing intents
// are never refused: they cost no backend call (create looks the key up on a refusal and
// joins or replays what holds it).

// slot takes a place for a new execution with a body of bodyLen bytes under the node's
// bounds; free gives it back (idempotent). ErrOverloaded when there is no room.
func (c *Core) slot(bodyLen int) (free func(), err error) {
	if bound := c.opts.MaxQueueWait; bound > 0 && c.queue != nil {
		if w := c.queue.Wait(); w > bound {
			return nil, fmt.Errorf("%w: the job queue's head has waited %s (max_queue_wait %s)", ErrOverloaded, w.Round(time.Millisecond), bound)
		}
	}
	if bound := c.opts.MaxExecutions; bound > 0 {
		if c.executions.Add(1) > int64(bound) {
			c.executions.Add(-1)
			return nil, fmt.Errorf("%w: %d new executions in flight on this node (max_executions)", ErrOverloaded, bound)
		}
	}
	n := int64(bodyLen)
	if bound := c.opts.MaxBodyBytesInFlight; bound > 0 {
		// A body alone larger than the bound is admitted on an idle node (the HTTP limit
		// bounds it), so no request can be refused for ever.
		if held := c.bodyBytes.Add(n); held > bound && held != n {
			c.bodyBytes.Add(-n)
			if c.opts.MaxExecutions > 0 {
				c.executions.Add(-1)
			}
			return nil, fmt.Errorf("%w: %d bytes of request bodies in flight on this node (max_body_bytes_in_flight %d)", ErrOverloaded, held-n, bound)
		}
	}
	var freed atomic.Bool
	return func() {
		if freed.CompareAndSwap(false, true) {
			if c.opts.MaxExecutions > 0 {
				c.executions.Add(-1)
			}
			if c.opts.MaxBodyBytesInFlight > 0 {
				c.bodyBytes.Add(-n)
			}
		}
	}, nil
}
