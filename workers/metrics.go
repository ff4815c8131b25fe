package workers

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/telemetry"
)

// countAttempt counts one attempt sent to backend name by what came of it: the status it
// answered with, or why it has none (never sent, timed out, or written and unanswered).
func (p *Pool) countAttempt(name string, resp *http.Response, err error, retry bool) {
	m := p.opts.Metrics
	if m == nil {
		return
	}
	var r telemetry.Result
	var ne net.Error
	switch {
	case err == nil:
		r = telemetry.ResultOf(resp.StatusCode)
	case errors.Is(err, backend.ErrNotSent), errors.Is(err, backend.ErrResendSafe):
		r = telemetry.ResultNotSent
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		r = telemetry.ResultTimeout
	default:
		r = telemetry.ResultAmbiguous
	}
	m.Attempt(name, r, retry)
}

// breakerChanged reports backend name's breaker changes to m.
func breakerChanged(m *telemetry.Metrics, name string) func(to string) {
	return func(to string) {
		s := telemetry.BreakerClosed
		switch to {
		case "open":
			s = telemetry.BreakerOpen
		case "half-open":
			s = telemetry.BreakerHalfOpen
		}
		m.Breaker(name, s, true)
	}
}

// answeredBy is the backend an execution's outcome is counted under: the one that answered,
// else the route's first (none answered: refused, open, or degraded).
func (ex *execution) answeredBy() string {
	if ex.backend != "" || len(ex.job.Backends) == 0 {
		return ex.backend
	}
	return ex.job.Backends[0]
}
