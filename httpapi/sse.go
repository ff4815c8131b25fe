package httpapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/jobs"
)

// sseOut writes an SSE response from a stream writer. Each send extends the connection's write
// deadline, so a stalled client is dropped after writeTimeout while a long stream that keeps
// moving is never cut (fasthttp's WriteTimeout would otherwise bound the whole response).
type sseOut struct {
	w         *bufio.Writer
	conn      net.Conn
	timeout   time.Duration
	heartbeat *time.Timer // reused for every wait (created on the first)
	// deadlineSet is when the write deadline was last moved; it moves at most every
	// timeout/8 (a syscall per chunk per client otherwise), so a stalled client is still
	// dropped between 7/8 and 1 timeout after its last successful write.
	deadlineSet time.Time
}

// newSSE prepares the SSE headers; call it in the handler, use the result in the writer.
func (s *Server) newSSE(c *fiber.Ctx) *sseOut {
	c.Set(fiber.HeaderContentType, mimeSSE)
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set("X-Accel-Buffering", "no")
	return &sseOut{conn: c.Context().Conn(), timeout: s.writeTimeout}
}

// send writes parts and flushes; an error means the client is gone.
func (o *sseOut) send(parts ...[]byte) error { return o.write(true, parts...) }

// sendBatched writes parts and flushes only when fl has no further chunk ready: a follower
// that fell behind, or that replays history, catches up in one write instead of one per chunk,
// and a follower that keeps up still flushes every chunk.
func (o *sseOut) sendBatched(fl *jobs.Follower, parts ...[]byte) error {
	return o.write(!fl.Ready(), parts...)
}

func (o *sseOut) write(flush bool, parts ...[]byte) error {
	if o.conn != nil && o.timeout > 0 {
		if now := time.Now(); now.Sub(o.deadlineSet) >= o.timeout/8 {
			_ = o.conn.SetWriteDeadline(now.Add(o.timeout))
			o.deadlineSet = now
		}
	}
	for _, p := range parts {
		if _, err := o.w.Write(p); err != nil {
			return err
		}
	}
	if !flush {
		return nil
	}
	return o.w.Flush()
}

var pingFrame = []byte(": ping\n\n")

// errClientGone: a write to the client failed; it disconnected.
var errClientGone = errors.New("httpapi: client gone")

// next waits for the follower's next chunk, sending a comment heartbeat while it waits so a
// disconnected client is noticed.
func (o *sseOut) next(ctx context.Context, fl *jobs.Follower) (jobs.Chunk, error) {
	for {
		if fl.Ready() {
			return fl.Next(ctx)
		}
		if o.heartbeat == nil {
			o.heartbeat = time.NewTimer(heartbeatEvery)
		} else {
			o.heartbeat.Reset(heartbeatEvery)
		}
		ch, ok, err := fl.NextOr(ctx, o.heartbeat.C)
		if ok || err != nil {
			return ch, err
		}
		if err := o.send(pingFrame); err != nil {
			return ch, fmt.Errorf("%w: %w", errClientGone, err)
		}
	}
}

// stop releases the heartbeat timer.
func (o *sseOut) stop() {
	if o.heartbeat != nil {
		o.heartbeat.Stop()
	}
}
