package httpapi

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/internal/natsrv"
)

// recoveringRetryAfter is the Retry-After of a request answered while the store is restored:
// a restore takes seconds to minutes (docs/operations/running.md).
const recoveringRetryAfter = 5

// Recovering is what an API node serves on its port while its embedded store is restored at
// start, before the API exists: GET /healthz answers 200 (the process is alive: a liveness
// probe must not kill a restore, which would begin again), GET /readyz 503 with how far the
// restore is, and everything else 503 store_unavailable in the route's provider format, with
// Retry-After. It reads no request body and keeps no connection open (Connection: close), so
// the real API can take the port over at once. A port that answers at once has none of the
// trouble of a port that only accepts (see gateway.start): nothing waits in a backlog.
//
// Its methods are safe for concurrent use.
type Recovering struct {
	app *fiber.App

	mu       sync.Mutex
	rec      natsrv.Recovery
	restored bool
}

// NewRecovering is a Recovering that reports an empty restore until Set.
func NewRecovering() *Recovering {
	r := &Recovering{}
	r.app = fiber.New(fiber.Config{
		AppName:               "oncegate",
		ReadTimeout:           5 * time.Second,
		WriteTimeout:          5 * time.Second,
		IdleTimeout:           5 * time.Second,
		DisableStartupMessage: true,
		// The body is never read: the answer does not depend on it.
		StreamRequestBody: true,
		// An unreadable request (too large a header, a bad line) is answered the same way.
		ErrorHandler: func(c *fiber.Ctx, _ error) error { return r.answer(c) },
	})
	r.app.Use(r.answer)
	return r
}

// Set reports how far the restore is.
func (r *Recovering) Set(rec natsrv.Recovery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec = rec
}

// Restored reports the restore ended: the node is starting (creating its streams, joining its
// workers) until the API takes the port over.
func (r *Recovering) Restored() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restored = true
}

// Serve answers on ln until Shutdown (net.ErrClosed-free: nil when shut down).
func (r *Recovering) Serve(ln net.Listener) error { return r.app.Listener(ln) }

// Shutdown stops answering and closes the listener Serve was given; answers in flight finish
// within ctx.
func (r *Recovering) Shutdown(ctx context.Context) error { return r.app.ShutdownWithContext(ctx) }

// recoveringReadyz is /readyz's body while the store is restored.
type recoveringReadyz struct {
	Status         string   `json:"status"` // "recovering", then "starting"
	Message        string   `json:"message"`
	Streams        []string `json:"streams,omitempty"`
	StreamsDone    int      `json:"streams_restored"`
	ElapsedSeconds float64  `json:"elapsed_seconds"`
	ReadBytes      int64    `json:"read_bytes,omitempty"` // absent where the system does not count it
	StoreBytes     int64    `json:"store_bytes"`
}

func (r *Recovering) answer(c *fiber.Ctx) error {
	c.Context().SetConnectionClose()
	get := c.Method() == fiber.MethodGet || c.Method() == fiber.MethodHead
	switch {
	case get && c.Path() == "/healthz":
		return c.JSON(fiber.Map{"status": "ok"})
	case get && c.Path() == "/readyz":
		return c.Status(fiber.StatusServiceUnavailable).JSON(r.readyz())
	}
	return writeAPIError(c, answer(errRecovering))
}

func (r *Recovering) readyz() recoveringReadyz {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.restored {
		return recoveringReadyz{Status: "starting", Message: "the message store is restored; the gateway is starting",
			StreamsDone: r.rec.Restored, StoreBytes: r.rec.StoreBytes}
	}
	body := recoveringReadyz{Status: "recovering", Message: "the message store is being restored after a restart: " + r.rec.String(),
		Streams: r.rec.Streams, StreamsDone: r.rec.Restored, ElapsedSeconds: r.rec.Elapsed.Seconds(), StoreBytes: r.rec.StoreBytes}
	if r.rec.ReadBytes > 0 {
		body.ReadBytes = r.rec.ReadBytes
	}
	return body
}
