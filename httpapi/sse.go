package httpapi

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/jobs"
)

// sseWriter is the one writer of SSE answers: the chat stream and the job events, live (after
// the handler returned, following an execution) or in one piece (from a record). It sets the
// headers, numbers the events of a job stream, and for a live stream batches writes while the
// follower has more ready, sends a heartbeat while it waits, and extends the connection's
// write deadline on each send, so a stalled client is dropped after timeout while a long
// stream that keeps moving is never cut (fasthttp's WriteTimeout would otherwise bound the
// whole response). Not safe for concurrent use: one per response.
type sseWriter struct {
	// ids: every event gets "id: N" (its index in the stream) and ids up to after are skipped,
	// so a job stream resumes after Last-Event-ID. The chat stream has no ids.
	ids   bool
	after int
	next  int // id of the next event

	// A live stream only.
	written   int            // bytes written so far (the access log's)
	fl        *jobs.Follower // batching follows it; closed by stop
	w         *bufio.Writer
	conn      net.Conn
	timeout   time.Duration
	heartbeat *time.Timer   // reused for every wait (created on the first)
	pingEvery time.Duration // heartbeatEvery when 0 (tests set it shorter)
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

// live answers with a stream that run writes after the handler returned, following fl; run
// captures only owned values (Fiber reuses the handler's memory) and ends the stream by
// returning. writeTimeout bounds each flush.
func (o *sseWriter) live(c *fiber.Ctx, fl *jobs.Follower, writeTimeout time.Duration, run func()) {
	setSSEHeaders(c)
	c.Status(http.StatusOK)
	o.fl, o.conn, o.timeout = fl, c.Context().Conn(), writeTimeout
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

// write sends b, flushing only when the follower has no further chunk ready: a follower that
// fell behind, or that replays history, catches up in one write instead of one per chunk, and
// a follower that keeps up still flushes every chunk. An error means the client is gone.
func (o *sseWriter) write(b []byte) error {
	return o.send(o.fl == nil || !o.fl.Ready(), o.frame(b))
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

// nextChunk waits for the follower's next chunk, sending a comment heartbeat while it waits so
// a disconnected client is noticed. After each heartbeat idle, when set, is asked whether to
// go on waiting: its error ends the wait (a record that says the execution ended, although
// its terminal chunk never came).
func (o *sseWriter) nextChunk(ctx context.Context, idle func() error) (jobs.Chunk, error) {
	for {
		if o.fl.Ready() {
			return o.fl.Next(ctx)
		}
		every := cmp.Or(o.pingEvery, heartbeatEvery)
		if o.heartbeat == nil {
			o.heartbeat = time.NewTimer(every)
		} else {
			o.heartbeat.Reset(every)
		}
		ch, ok, err := o.fl.NextOr(ctx, o.heartbeat.C)
		if ok || err != nil {
			return ch, err
		}
		if err := o.send(true, pingFrame); err != nil {
			return ch, fmt.Errorf("%w: %w", errClientGone, err)
		}
		if idle != nil {
			if err := idle(); err != nil {
				return ch, err
			}
		}
	}
}

// follow makes fl the stream's follower, closing the one before; nil leaves none (every
// write flushes).
func (o *sseWriter) follow(fl *jobs.Follower) {
	if o.fl != nil {
		o.fl.Close()
	}
	o.fl = fl
}

// stop closes the follower and releases the heartbeat timer.
func (o *sseWriter) stop() {
	o.follow(nil)
	if o.heartbeat != nil {
		o.heartbeat.Stop()
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
