// Package clock holds the one timing helper several packages need: a sleep that a context
// can cut short. Safe for concurrent use.
package clock

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends; it reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
