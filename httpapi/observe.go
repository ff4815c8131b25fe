package httpapi

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/genai"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/tracing"
)

// observation is one request's measurements, carried to where its answer is decided (the
// handler's return, or for a live stream the end of its stream writer). There, finish counts
// it once in oncegate_requests_total, ends its span and writes its access-log line. Outcomes
// map as: intent's four (created, joined, replayed, bypassed) as admitted;
// intent.ErrKeyReused and ErrKeyForeign (422) conflict; errKeyInUse (409) in_use; an answer
// marked Oncegate-Degraded (the route's degraded answer) degraded; any other error before
// admission rejected (a 4xx, or a 5xx when the store, the budget or the record could not be
// read); an error after admission keeps the admission's outcome under the error's status
// class.
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
	// span is the request's trace span (tracing.Tracer.Start); traceID its trace.
	span    trace.Span
	traceID string
	// tenant and key (the record key: a hash, never the client's key) once parsed.
	tenant, key string
	// dashCounted: the dashboard's tally counted the admission's outcome when it was decided
	// (admit), so that a copy shows as joined when it attaches, not when its answer ends;
	// finish counts it there only for a request that never got an admission.
	dashCounted bool
}

// startObservation begins a request's measurements and its span, whose context (the
// client's traceparent, or a new trace) the returned ctx carries.
func (s *Server) startObservation(c *fiber.Ctx, route telemetry.Route, api telemetry.API) (context.Context, observation) {
	// Fiber's header strings live in its reused buffers; a tracestate the span keeps must not.
	ctx, span := s.tracer.Start(c.UserContext(), func(h string) string { return strings.Clone(c.Get(h)) }, c.Method()+" "+c.Path())
	return ctx, observation{start: time.Now(), route: route, api: api, span: span, traceID: tracing.TraceID(ctx)}
}

// routeOf is the route label of a generation API.
func routeOf(api string) telemetry.Route {
	if api == apiAnthropic {
		return telemetry.RouteMessages
	}
	return telemetry.RouteChat
}

// ending is how a request ended, for finish.
type ending struct {
	outcome  telemetry.Outcome
	status   int
	ttft     time.Duration // streams: to the first content byte (0: none)
	bytes    int           // the response body's bytes
	backend  string        // the backend that answered, as the client was told
	attempts string
	err      error
	adm      *intent.Admission // nil before admission
}

// finish counts the request, ends its span and writes its access-log line.
func (s *Server) finish(o *observation, e ending) {
	dur := time.Since(o.start)
	s.metrics.Request(o.route, o.api, e.outcome, e.status, dur, e.ttft)
	if !o.dashCounted {
		s.dashTally.Request(o.tenant, e.outcome)
	}
	o.span.SetAttributes(attribute.String("oncegate.outcome", e.outcome.String()), attribute.Int("http.response.status_code", e.status))
	if e.adm != nil {
		o.span.SetAttributes(attribute.String("oncegate.job_id", e.adm.JobID), attribute.String("oncegate.idem_key_hash", e.adm.Key))
		if epoch := e.adm.Epoch(); epoch > 0 {
			o.span.SetAttributes(attribute.Int("oncegate.epoch", epoch))
		}
		// What the request asked, in the GenAI conventions; the operation itself (provider,
		// usage, finish reasons) is the execution's span's: a joined or replayed copy ran none.
		if rec := e.adm.Rec; rec != nil && o.span.IsRecording() {
			if op := genai.Operation(rec.API); op != "" {
				o.span.SetAttributes(genai.OperationName.String(op), genai.RequestModel.String(rec.Model))
			}
		}
	}
	if e.err != nil {
		o.span.SetStatus(codes.Error, e.err.Error())
	}
	o.span.End()
	s.accessLog(o, e, dur)
}

// accessLog writes the request's line at info: every failure (5xx), and of the others the
// share access_log.sample says, chosen by trace id so that every node keeps or drops the same
// traces. A shed (503 overloaded) is sampled like a 429: it is the bound doing its job, it
// comes in floods (a client that ignores Retry-After sends one every few ms), and the request
// counters count every one. It names the tenant, the record key's hash, the job and epoch,
// never a client's key, body or credential.
func (s *Server) accessLog(o *observation, e ending, dur time.Duration) {
	failed := e.status >= 500 && !errors.Is(e.err, intent.ErrOverloaded)
	if !failed && !s.sampled(o.traceID) {
		return
	}
	ev := s.log.Info()
	if !ev.Enabled() {
		return
	}
	ev = ev.Str("route", o.route.String()).Str("api", o.api.String()).Str("outcome", e.outcome.String()).Int("status", e.status).
		Dur("duration", dur).Int("bytes", e.bytes).Str(fieldTraceID, o.traceID)
	if o.tenant != "" {
		ev = ev.Str("tenant", o.tenant)
	}
	key := o.key
	if e.adm != nil {
		key = e.adm.Key // a bypass gets its record key at admission
	}
	if key != "" {
		ev = ev.Str(fieldKey, key)
	}
	if e.adm != nil {
		ev = ev.Str(fieldJobID, e.adm.JobID)
		if epoch := e.adm.Epoch(); epoch > 0 {
			ev = ev.Int("epoch", epoch)
		}
	}
	if e.backend != "" {
		ev = ev.Str("backend", e.backend)
	}
	if n, err := strconv.Atoi(e.attempts); err == nil {
		ev = ev.Int("attempts", n)
	}
	if e.ttft > 0 {
		ev = ev.Dur("ttft", e.ttft)
	}
	if e.err != nil && e.status >= 500 {
		ev = ev.AnErr("error", e.err)
	}
	ev.Msg("request")
}

// sampled says whether the access log keeps the request of traceID: its first 8 hex digits
// as a fraction of 2^32 below the sample ratio (a trace id's are random).
func (s *Server) sampled(traceID string) bool {
	switch r := s.accessSample; {
	case r >= 1:
		return true
	case r <= 0:
		return false
	case len(traceID) < 8:
		return true
	default:
		v, err := strconv.ParseUint(traceID[:8], 16, 32)
		return err != nil || float64(v) < r*(1<<32)
	}
}

// countError finishes a request answered with err; adm is its admission, if it got that far.
func (s *Server) countError(o *observation, adm *intent.Admission, err error) {
	out := telemetry.Rejected
	switch {
	case errors.Is(err, intent.ErrKeyReused), errors.Is(err, intent.ErrKeyForeign):
		out = telemetry.Conflict
	case errors.Is(err, errKeyInUse):
		out = telemetry.InUse
	case adm != nil:
		out, _ = telemetry.OutcomeOf(string(adm.Outcome))
	}
	s.finish(o, ending{outcome: out, status: answer(err).Status, err: err, adm: adm})
}

// countAnswer finishes a request answered in the handler (not a live stream), from the
// status and headers it set; and counts its avoided execution, if it was a copy.
func (s *Server) countAnswer(c *fiber.Ctx, o *observation, adm *intent.Admission) {
	out, _ := telemetry.OutcomeOf(string(adm.Outcome))
	h := &c.Response().Header
	if string(h.Peek(headerDegraded)) == "true" {
		out = telemetry.Degraded
	}
	end := time.Now()
	var ttft time.Duration
	if o.stream { // answered in one piece: its first content byte goes with the last
		ttft = end.Sub(o.start)
	}
	s.finish(o, ending{outcome: out, status: c.Response().StatusCode(), ttft: ttft, bytes: len(c.Response().Body()),
		backend: string(h.Peek(headerBackend)), attempts: string(h.Peek(headerAttempts)), adm: adm})
	if adm.Outcome == intent.Created {
		added := o.admitted
		if !o.firstChunk.IsZero() {
			added += end.Sub(o.firstChunk)
		}
		s.metrics.AddedLatency(o.api, added)
		s.dashTally.Added(o.tenant, added)
	}
	adm.Avoided(c.UserContext())
}

// streamEnd is what a live stream's writer knows when it ends.
type streamEnd struct {
	ttft       time.Duration // from the start to its first content write
	firstWrite time.Time     // when that write ended
	bytes      int
	// backend and attempts as the stream's headers said (copied: the handler's memory is gone).
	backend, attempts string
}

// countStream finishes a live stream when its writer ends.
func (s *Server) countStream(ctx context.Context, o *observation, adm *intent.Admission, se streamEnd) {
	out, _ := telemetry.OutcomeOf(string(adm.Outcome))
	s.finish(o, ending{outcome: out, status: fiber.StatusOK, ttft: se.ttft, bytes: se.bytes, backend: se.backend, attempts: se.attempts, adm: adm})
	if adm.Outcome == intent.Created && !o.firstChunk.IsZero() && !se.firstWrite.IsZero() {
		s.metrics.AddedLatency(o.api, o.admitted+se.firstWrite.Sub(o.firstChunk))
		s.dashTally.Added(o.tenant, o.admitted+se.firstWrite.Sub(o.firstChunk))
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

// fieldTraceID is the log field of the W3C trace id (the workers log the same).
const fieldTraceID = "trace_id"
