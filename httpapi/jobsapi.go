package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/telemetry"
)

func (s *Server) routesJobs(r fiber.Router) {
	r.Post("/jobs", s.createJob)
	r.Get("/jobs/:id", s.getJob)
	r.Get("/jobs/:id/events", s.jobEvents)
	r.Delete("/jobs/:id", s.cancelJob)
	r.Get("/idempotency/:key", s.getIdempotency)
}

// createJob is POST /v1/jobs: a chat completion request, always answered 202 (the same
// intent as the identical POST /v1/chat/completions); or, sent with an anthropic-version
// header (which every Anthropic SDK sends), an Anthropic Messages request (the same intent
// as the identical POST /v1/messages), whose events, result and errors are Anthropic's.
func (s *Server) createJob(c *fiber.Ctx) error {
	ctx, obs := s.startObservation(c, telemetry.RouteJobs, telemetry.APIJobs)
	api, path := jobAPI(c)
	g, err := s.parseGeneration(c, api)
	if err != nil {
		s.countError(&obs, nil, err)
		return err
	}
	if g.Auto { // the same intent as the identical POST to the API's own endpoint
		g.setAuto(s.intents.Partitions(), http.MethodPost, path)
	}
	g.observe(ctx, obs)
	g.setAsync()
	return s.admitAndAnswer(ctx, c, g, s.respondAccepted)
}

// jobAPI is the wire format of a POST /v1/jobs body and the endpoint it shares intents with:
// Anthropic Messages when the request says anthropic-version, else OpenAI chat completions.
func jobAPI(c *fiber.Ctx) (api, path string) {
	if c.Get("anthropic-version") != "" {
		return apiAnthropic, "/v1/messages"
	}
	return apiOpenAI, "/v1/chat/completions"
}

// loadJob finds a job of the caller's tenant. A malformed, unknown or foreign id is the same 404.
func (s *Server) loadJob(c *fiber.Ctx) (*intent.View, error) {
	tenant, err := s.authenticate(c)
	if err != nil {
		return nil, err
	}
	return s.intents.JobView(c.UserContext(), tenant, c.Params("id"))
}

// jobView is the JSON of GET /v1/jobs/{id}.
type jobView struct {
	ID        string             `json:"id"`
	Object    string             `json:"object"`
	Status    string             `json:"status"`
	Model     string             `json:"model"`
	CreatedAt int64              `json:"created_at"`
	Epoch     int                `json:"epoch"`
	Attempts  int                `json:"attempts"`
	Progress  string             `json:"progress,omitempty"`
	Tokens    int                `json:"tokens_so_far"`
	Usage     *intent.TokenUsage `json:"usage,omitempty"`
	Result    json.RawMessage    `json:"result,omitempty"`
	Error     json.RawMessage    `json:"error,omitempty"`
	// TraceID is the trace the execution continues: the creating request's.
	TraceID string `json:"trace_id,omitempty"`
	// Dedup: which execution copies of this job's key attach to, and by which rules.
	Dedup *dedupView `json:"dedup"`
}

func (s *Server) getJob(c *fiber.Ctx) error {
	job, err := s.loadJob(c)
	if err != nil {
		return err
	}
	job = s.intents.Progressed(c.UserContext(), job)
	v := jobView{ID: job.ID, Object: "job", Status: job.Status(), Model: job.Model, CreatedAt: job.Created.Unix(),
		Epoch: job.Epoch, Attempts: job.Attempts, Progress: job.Progress, Tokens: tokensOut(job), TraceID: job.TraceID, Dedup: s.dedupOf(job)}
	if res := job.Answer; res != nil {
		v.Usage = res.Usage
		switch {
		case res.OK():
			body := res.Body
			if job.Stream {
				if body, err = wireOf(job.API).assemble(res.Events, res.UsageEvent); err != nil {
					return err
				}
			}
			if json.Valid(body) { // a passthrough's answer may be audio or an image: GET /v1/jobs shows JSON only
				v.Result = body
			}
		case len(res.Body) > 0:
			v.Error = errorObject(res.Body)
		}
	}
	return c.JSON(v)
}

// tokensOut is the output tokens of a job: the backend's usage once there is one (a
// non-stream execution counts no events), else the events seen so far.
func tokensOut(v *intent.View) int {
	if res := v.Answer; res != nil && res.Usage != nil && res.Usage.CompletionTokens > 0 {
		return res.Usage.CompletionTokens
	}
	return v.Tokens
}

// errorObject extracts {"message",...} from an OpenAI error body (or wraps a foreign one).
func errorObject(body []byte) json.RawMessage {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && len(e.Error) > 0 {
		return e.Error
	}
	b, _ := json.Marshal(map[string]string{"message": string(body)})
	return b
}

// cancelJob is DELETE /v1/jobs/{id}: a running job's record becomes cancelled (by CAS, which
// also fences its worker: the worker's next record or chunk write fails and it stops the
// backend call), followers get an error event. A finished job is left as it is.
func (s *Server) cancelJob(c *fiber.Ctx) error {
	tenant, err := s.authenticate(c)
	if err != nil {
		return err
	}
	v, err := s.intents.CancelJob(c.UserContext(), tenant, c.Params("id"), cancelledBody)
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"id": v.ID, "object": "job", "status": v.Status()})
}

// getIdempotency is GET /v1/idempotency/{key}: where the work of a key stands.
func (s *Server) getIdempotency(c *fiber.Ctx) error {
	tenant, err := s.authenticate(c)
	if err != nil {
		return err
	}
	key, err := pathKey(c)
	if err != nil {
		return err
	}
	v, err := s.intents.KeyStatus(c.UserContext(), tenant, key)
	if err != nil {
		return err
	}
	out := fiber.Map{"key": key, "state": v.State, "job_id": v.ID, "epoch": v.Epoch,
		"created": v.Created.UTC().Format(time.RFC3339Nano), "started": v.EpochStarted.UTC().Format(time.RFC3339Nano),
		"attempts": v.Attempts, "takeovers": v.Takeovers, "progress": v.Progress, "job_status": v.Status(),
		"tokens_so_far": tokensOut(v), "stream": v.Stream, "model": v.Model, "backend": v.Backend}
	if v.Running() {
		out["lease_until"] = v.LeaseUntil.UTC().Format(time.RFC3339Nano)
	}
	if !v.Sent.IsZero() {
		out["sent"] = v.Sent.UTC().Format(time.RFC3339Nano) // when the current attempt was sent
	}
	if res := v.Answer; res != nil {
		out["status"] = res.Status
		if res.Failed && res.Partial {
			// The clients got 200 and part of the stream, then an error event: the outcome
			// is the backend's broken stream, not a success.
			out["status"], out["partial"] = http.StatusBadGateway, true
		}
		if res.Failed && len(res.Body) > 0 {
			out["error"] = errorObject(res.Body)
		}
		out["finished"] = res.Finished.UTC().Format(time.RFC3339Nano)
	}
	if v.Cancelled {
		out["cancelled"] = true
	}
	out["dedup"] = s.dedupOf(v)
	return c.JSON(out)
}

// pathKey is the Idempotency-Key a status route names ({key}, URL-escaped), checked and
// owned (not Fiber's memory).
func pathKey(c *fiber.Ctx) (string, error) {
	raw, err := url.PathUnescape(c.Params("key"))
	if err != nil {
		return "", errKeyNotPathText
	}
	key, err := parseIdempotencyKey(raw)
	if err != nil {
		return "", keyPathInvalid(err)
	}
	return strings.Clone(key), nil
}

// jobEvents is GET /v1/jobs/{id}/events: the job's output as SSE, replayed from the start then
// live; every event has an id (its index), and Last-Event-ID or ?starting_after=N resumes
// right after N. A finished job whose events were all delivered answers 204.
func (s *Server) jobEvents(c *fiber.Ctx) error {
	tenant, err := s.authenticate(c)
	if err != nil {
		return err
	}
	return s.tenantJobEvents(c, tenant)
}

// tenantJobEvents is GET /v1/jobs/{id}/events for tenant (already authenticated; the
// dashboard's transcript too).
func (s *Server) tenantJobEvents(c *fiber.Ctx, tenant string) error {
	job, err := s.intents.JobView(c.UserContext(), tenant, c.Params("id"))
	if err != nil {
		return err
	}
	if job.API == apiEmbeddings || job.API == apiPassthrough {
		return errNoEvents
	}
	after := -1
	if v := c.Get("Last-Event-ID"); v != "" {
		if after, err = strconv.Atoi(v); err != nil || after < -1 {
			return errBadLastEventID
		}
	} else if v := c.Query("starting_after"); v != "" {
		if after, err = strconv.Atoi(v); err != nil || after < -1 {
			return errBadStartingAfter
		}
	}
	if !job.Running() {
		events, err := finishedEvents(job)
		if err != nil {
			return err
		}
		if after >= len(splitFrames(events))-1 {
			return c.SendStatus(http.StatusNoContent)
		}
		return eventStream(after).whole(c, events)
	}
	d, release, err := s.intents.FollowJob(c.UserContext(), job)
	if err != nil {
		return err
	}
	out := eventStream(after)
	r := &eventsRender{w: wireOf(job.API), out: out, log: s.log, jobID: job.ID}
	s.streamLive(c, out, d, r, nil, time.Time{}, func(context.Context, streamEnd) { release() })
	return nil
}

// eventsRender writes a job's events: every chunk's frames as they are, numbered by out.
type eventsRender struct {
	w     wire
	out   *sseWriter
	log   zerolog.Logger
	jobID string
}

func (r *eventsRender) start() []byte { return nil }

func (r *eventsRender) output(ev intent.Event) []byte { return ev.Payload() }

func (r *eventsRender) end(_ context.Context, ev intent.Event) []byte {
	w := r.w
	switch ev.Kind {
	case intent.Done:
		return w.doneFrame()
	case intent.Result:
		if ev.Status() == http.StatusOK {
			if synth, err := synthesizedEvents(w, ev.Payload()); err == nil {
				return synth
			}
		}
		return w.errorFrame(ev.Payload())
	case intent.Error:
		return w.errorFrame(ev.Payload())
	case intent.Finished:
		// The record says how the execution ended: this client's stream ends from it if it
		// finished the epoch this client followed (or this client got nothing yet).
		if !ev.Sent || ev.SameEpoch {
			if events, err := finishedEvents(ev.View); err == nil {
				// The events sent so far are the record's first ones: skip them.
				r.out.after, r.out.next = max(r.out.after, r.out.next-1), 0
				return events
			}
		}
	}
	r.log.Warn().Str(fieldJobID, r.jobID).Msg("job events: execution interrupted")
	return w.errorFrame(w.restarted())
}

func (r *eventsRender) failed(err error) ([]byte, bool) {
	if !errors.Is(err, intent.ErrInterrupted) {
		return nil, false // out of time, or early output lost: the client resumes by id
	}
	r.log.Warn().Err(err).Str(fieldJobID, r.jobID).Msg("job events: execution interrupted")
	return r.w.errorFrame(r.w.restarted()), true
}

// synthesizedEvents are the events of a complete body, usage and end included.
func synthesizedEvents(w wire, body []byte) ([]byte, error) {
	events, usage, err := w.synthesize(body)
	if err != nil {
		return nil, err
	}
	return append(append(append([]byte{}, events...), usage...), w.doneFrame()...), nil
}

// finishedEvents are every event of a finished job, in order.
func finishedEvents(v *intent.View) ([]byte, error) {
	res := v.Answer
	if res == nil {
		return nil, fmt.Errorf("httpapi: record of %s has no result", v.ID)
	}
	w := wireOf(v.API)
	if (res.Failed && !res.Partial) || (!res.Failed && res.Status != http.StatusOK) {
		return w.errorFrame(res.Body), nil
	}
	if !v.Stream {
		return synthesizedEvents(w, res.Body)
	}
	all := append(append([]byte{}, res.Events...), res.UsageEvent...)
	if res.Failed {
		return append(all, w.errorFrame(res.Body)...), nil
	}
	return append(all, w.doneFrame()...), nil
}

// cancelledBody is the error body a cancelled job's followers get, in its API's format.
func cancelledBody(api string) []byte { return wireOf(api).errorBody(errJobCancelled) }
