package httpapi

import (
	"context"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
)

// readyTTL is how long one /readyz verdict is reused: the check asks JetStream and reads the
// workers' status board, and load balancers poll often.
const readyTTL = time.Second

// readiness is /readyz's last verdict; one check runs at a time, concurrent pollers share it.
type readiness struct {
	mu     sync.Mutex
	at     time.Time
	reason string // why not ready; "" = ready
}

// ResourceChecker reports whether every JetStream stream and bucket the gateway needs exists:
// nil when they do, else an error that says which are missing.
type ResourceChecker interface {
	Check(ctx context.Context) error
}

// readyz is 200 when this API node can get a request executed: connected to NATS, JetStream
// answers, every stream and bucket exists (memory streams are lost with a NATS restart until
// the gateway recreates them), and at least one worker has posted to the status board within its TTL (a worker
// posts every 2 s while its pool consumes JOBS, and removes its entry when it stops; a worker
// that died without stopping drops off when the entry expires, 10 s). Otherwise 503 with the
// reason, so a load balancer does not send requests that would only wait in the queue.
func (s *Server) readyz(c *fiber.Ctx) error {
	if s.nc == nil || !s.nc.IsConnected() { // cheap: no cache
		return writeAPIError(c, unavailable("not connected to NATS"))
	}
	if reason := s.readyReason(); reason != "" {
		return writeAPIError(c, unavailable(reason))
	}
	return c.JSON(fiber.Map{"status": "ready"})
}

func (s *Server) readyReason() string {
	r := &s.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := s.now(); r.at.IsZero() || now.Sub(r.at) >= readyTTL || now.Before(r.at) {
		r.reason, r.at = s.checkReady(), now
	}
	return r.reason
}

func (s *Server) checkReady() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := s.js.AccountInfo(ctx); err != nil {
		return "JetStream is not available"
	}
	if s.resources != nil {
		if err := s.resources.Check(ctx); err != nil {
			return err.Error()
		}
	}
	if s.status == nil { // no board (a bare API in unit tests): nothing to say about workers
		return ""
	}
	ws, err := s.status.Read(ctx)
	if err != nil {
		return "the workers' status board cannot be read"
	}
	if len(ws) == 0 {
		return "no worker is running: no worker has posted to the status board, so requests would wait in the JOBS queue"
	}
	return ""
}
