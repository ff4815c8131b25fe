package httpapi

import (
	"context"
	"errors"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/telemetry"
)

// observation is one request's measurements, carried to where its answer is decided (the
// handler's return, or for a live stream the end of its stream writer). Each request is
// counted once in oncegate_requests_total. Outcomes map as: intent's four (created, joined,
// replayed, bypassed) as admitted; intent.ErrKeyReused and ErrKeyForeign (422) conflict;
// errKeyInUse (409) in_use; an answer marked Oncegate-Degraded (the route's degraded answer)
// degraded; any other error before admission rejected (a 4xx, or a 5xx when the store, the
// budget or the record could not be read); an error after admission keeps the admission's
// outcome under the error's status class.
type observation struct {
	start  time.Time
	route  telemetry.Route
	api    telemetry.API
	stream bool // the client asked for a stream
	// admitted is the time from the start to the admission's decision: for a created request,
	// the API node's own work before the job is queued.
	admitted time.Duration
	// firstChunk is when the execution's first chunk (a non-stream copy: its terminal chunk)
	// reached this request.
	firstChunk time.Time
}

func newObservation(route telemetry.Route, api telemetry.API) observation {
	return observation{start: time.Now(), route: route, api: api}
}

// routeOf is the route label of a generation API.
func routeOf(api string) telemetry.Route {
	if api == apiAnthropic {
		return telemetry.RouteMessages
	}
	return telemetry.RouteChat
}

// countError counts a request answered with err; adm is its admission, if it got that far.
func (s *Server) countError(o *observation, adm *intent.Admission, err error) {
	if s.metrics == nil {
		return
	}
	out := telemetry.Rejected
	switch {
	case errors.Is(err, intent.ErrKeyReused), errors.Is(err, intent.ErrKeyForeign):
		out = telemetry.Conflict
	case errors.Is(err, errKeyInUse):
		out = telemetry.InUse
	case adm != nil:
		out, _ = telemetry.OutcomeOf(string(adm.Outcome))
	}
	s.metrics.Request(o.route, o.api, out, answer(err).Status, time.Since(o.start), 0)
}

// countAnswer counts a request answered in the handler (not a live stream), from the status
// and headers it set; and its avoided execution, if it was a copy.
func (s *Server) countAnswer(c *fiber.Ctx, o *observation, adm *intent.Admission) {
	if s.metrics == nil {
		return
	}
	out, _ := telemetry.OutcomeOf(string(adm.Outcome))
	if string(c.Response().Header.Peek(headerDegraded)) == "true" {
		out = telemetry.Degraded
	}
	end := time.Now()
	var ttft time.Duration
	if o.stream { // answered in one piece: its first content byte goes with the last
		ttft = end.Sub(o.start)
	}
	s.metrics.Request(o.route, o.api, out, c.Response().StatusCode(), end.Sub(o.start), ttft)
	if adm.Outcome == intent.Created {
		added := o.admitted
		if !o.firstChunk.IsZero() {
			added += end.Sub(o.firstChunk)
		}
		s.metrics.AddedLatency(o.api, added)
	}
	adm.Avoided(c.UserContext())
}

// countStream counts a live stream when its writer ends: ttft is from the start to its first
// content write, firstWrite when that write ended.
func (s *Server) countStream(ctx context.Context, o *observation, adm *intent.Admission, ttft time.Duration, firstWrite time.Time) {
	if s.metrics == nil {
		return
	}
	out, _ := telemetry.OutcomeOf(string(adm.Outcome))
	s.metrics.Request(o.route, o.api, out, fiber.StatusOK, time.Since(o.start), ttft)
	if adm.Outcome == intent.Created && !o.firstChunk.IsZero() && !firstWrite.IsZero() {
		s.metrics.AddedLatency(o.api, o.admitted+firstWrite.Sub(o.firstChunk))
	}
	adm.Avoided(ctx)
}

// metricsPage is GET /metrics on the API listener: open when no tenants are configured (every
// caller is anonymous, as on the other routes), else behind an admin key, because it names
// the tenants and their spend. metrics.listen serves it unauthenticated on its own port.
func (s *Server) metricsPage(c *fiber.Ctx) error {
	if len(s.tenants) > 0 {
		if err := s.authenticateAdmin(c); err != nil {
			return err
		}
	}
	return s.metricsHandler(c)
}
