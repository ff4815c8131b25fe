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
	w       *bufio.Writer
	conn    net.Conn
	timeout time.Duration
}

// newSSE prepares the SSE headers; call it in the handler, use the result in the writer.
func (s *Server) newSSE(c *fiber.Ctx) *sseOut {
	c.Set(fiber.HeaderContentType, mimeSSE)
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set("X-Accel-Buffering", "no")
	return &sseOut{conn: c.Context().Conn(), timeout: s.writeTimeout}
}

// send writes parts and flushes; an error means the client is gone.
func (o *sseOut) send(parts ...[]byte) error {
	if o.conn != nil && o.timeout > 0 {
		_ = o.conn.SetWriteDeadline(time.Now().Add(o.timeout))
	}
	for _, p := range parts {
		if _, err := o.w.Write(p); err != nil {
			return err
		}
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
		hctx, cancel := context.WithTimeout(ctx, heartbeatEvery)
		ch, err := fl.Next(hctx)
		cancel()
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return ch, err
		}
		if err := o.send(pingFrame); err != nil {
			return ch, fmt.Errorf("%w: %w", errClientGone, err)
		}
	}
}
