package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/intent"
)

// sseWriter is the one writer of SSE answers: chat completions, Anthropic messages, the job
// events and the Responses API, live (after the handler returned, following an execution; see
// run) or in one piece (from a record). It sets the headers, numbers the events of a job
// stream, and for a live stream batches writes while the feed has more ready, sends a
// heartbeat while it is idle, and extends the connection's write deadline on each send, so a
// stalled client is dropped after timeout while a long stream that keeps moving is never cut (fasthttp's WriteTimeout would otherwise bound the
// whole response). Not safe for concurrent use: one per response.
type sseWriter struct {
	// ids: every event gets "id: N" (its index in the stream) and ids up to after are skipped,
	// so a job stream resumes after Last-Event-ID. The chat stream has no ids.
	ids   bool
	after int
	next  int // id of the next event

	// A live stream only.
	written int  // bytes written so far (the access log's)
	feed    feed // batching follows it; closed by stop
	w       *bufio.Writer
	conn    net.Conn
	timeout time.Duration
	// deadlineSet is when the write deadline was last moved; it moves at most every
	// timeout/8 (a syscall per chunk per client otherwise), so a stalled client is still
	// dropped between 7/8 and 1 timeout after its last successful write.
	deadlineSet time.Time
}

// eventStream is the writer of a job's events, resuming after the event id after (-1: all).
func eventStream(after int) *sseWriter { return &sseWriter{ids: true, after: after} }

// setSSEHeaders marks the response as SSE, not to be cached or buffered by proxies.
func setSSEHeaders(c *fiber.Ctx) {
	c.Set(fiber.HeaderContentType, mimeSSE)
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set("X-Accel-Buffering", "no")
}

// whole answers with the stream b (complete SSE frames) in one piece.
func (o *sseWriter) whole(c *fiber.Ctx, b []byte) error {
	setSSEHeaders(c)
	return c.Status(http.StatusOK).Send(o.frame(b))
}

// feed is what a live stream follows (an *intent.Delivery): its events, Idle while it waits.
type feed interface {
	Next(ctx context.Context) (intent.Event, error)
	Ready() bool
	Close()
}

// live answers with a stream that run writes after the handler returned, following f; run
// captures only owned values (Fiber reuses the handler's memory) and ends the stream by
// returning. writeTimeout bounds each flush.
func (o *sseWriter) live(c *fiber.Ctx, f feed, writeTimeout time.Duration, run func()) {
	setSSEHeaders(c)
	c.Status(http.StatusOK)
	o.feed, o.conn, o.timeout = f, c.Context().Conn(), writeTimeout
	c.Context().SetBodyStreamWriter(func(bw *bufio.Writer) {
		o.w = bw
		defer o.stop()
		run()
	})
}

// frame is b as this stream writes it: as it is, or cut into events and numbered.
func (o *sseWriter) frame(b []byte) []byte {
	if !o.ids {
		return b
	}
	frames := splitFrames(b)
	out := appendEvents(nil, frames, o.next, o.after)
	o.next += len(frames)
	return out
}

// write sends b, flushing only when the feed has no further chunk ready: a follower that
// fell behind, or that replays history, catches up in one write instead of one per chunk, and
// a follower that keeps up still flushes every chunk. An error means the client is gone.
func (o *sseWriter) write(b []byte) error {
	return o.send(o.feed == nil || !o.feed.Ready(), o.frame(b))
}

// end sends the stream's last events and flushes.
func (o *sseWriter) end(b []byte) error { return o.send(true, o.frame(b)) }

func (o *sseWriter) send(flush bool, b []byte) error {
	if o.conn != nil && o.timeout > 0 {
		if now := time.Now(); now.Sub(o.deadlineSet) >= o.timeout/8 {
			_ = o.conn.SetWriteDeadline(now.Add(o.timeout))
			o.deadlineSet = now
		}
	}
	n, err := o.w.Write(b)
	o.written += n
	if err != nil {
		return err
	}
	if !flush {
		return nil
	}
	return o.w.Flush()
}

var pingFrame = []byte(": ping\n\n")

// errClientGone: a write to the client failed; it disconnected.
var errClientGone = errors.New("httpapi: client gone")

// nextEvent waits for the feed's next event, sending a comment heartbeat each time it is idle
// so a disconnected client is noticed.
func (o *sseWriter) nextEvent(ctx context.Context) (intent.Event, error) {
	for {
		ev, err := o.feed.Next(ctx)
		if err != nil || ev.Kind != intent.Idle {
			return ev, err
		}
		if err := o.send(true, pingFrame); err != nil {
			return ev, fmt.Errorf("%w: %w", errClientGone, err)
		}
	}
}

// stop closes the feed.
func (o *sseWriter) stop() {
	if o.feed != nil {
		o.feed.Close()
	}
}

// splitFrames cuts SSE bytes into frames (each without its closing blank line).
func splitFrames(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		frame, rest, _ := bytes.Cut(b, []byte("\n\n"))
		b = rest
		if len(bytes.TrimSpace(frame)) > 0 {
			out = append(out, frame)
		}
	}
	return out
}

// appendEvents writes frames numbered from first, skipping ids <= after.
func appendEvents(dst []byte, frames [][]byte, first, after int) []byte {
	for i, f := range frames {
		id := first + i
		if id <= after {
			continue
		}
		dst = append(dst, "id: "...)
		dst = strconv.AppendInt(dst, int64(id), 10)
		dst = append(dst, '\n')
		dst = append(dst, f...)
		dst = append(dst, '\n', '\n')
	}
	return dst
}
