package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
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
		g.setAuto(http.MethodPost, path)
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
func (s *Server) loadJob(c *fiber.Ctx) (key string, rec *kv.Record, err error) {
	tenant, err := s.authenticate(c)
	if err != nil {
		return "", nil, err
	}
	return s.loadTenantJob(c, tenant)
}

// loadTenantJob finds a job of tenant (already authenticated).
func (s *Server) loadTenantJob(c *fiber.Ctx, tenant string) (key string, rec *kv.Record, err error) {
	key, rec, _, err = s.intents.FindJob(c.UserContext(), tenant, c.Params("id"))
	return key, rec, err
}

// jobView is the JSON of GET /v1/jobs/{id}.
type jobView struct {
	ID        string          `json:"id"`
	Object    string          `json:"object"`
	Status    string          `json:"status"`
	Model     string          `json:"model"`
	CreatedAt int64           `json:"created_at"`
	Epoch     int             `json:"epoch"`
	Attempts  int             `json:"attempts"`
	Progress  string          `json:"progress,omitempty"`
	Tokens    int             `json:"tokens_so_far"`
	Usage     *kv.Usage       `json:"usage,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     json.RawMessage `json:"error,omitempty"`
	// TraceID is the trace the execution continues: the creating request's.
	TraceID string `json:"trace_id,omitempty"`
	// Dedup: which execution copies of this job's key attach to, and by which rules.
	Dedup *dedupView `json:"dedup"`
}

func (s *Server) getJob(c *fiber.Ctx) error {
	key, rec, err := s.loadJob(c)
	if err != nil {
		return err
	}
	rec, _ = s.intents.WithProgress(c.UserContext(), key, rec)
	v := jobView{ID: rec.JobID, Object: "job", Status: jobStatus(rec), Model: rec.Model, CreatedAt: rec.Created.Unix(),
		Epoch: rec.Epoch, Attempts: rec.Attempts, Progress: rec.Progress, Tokens: tokensOut(rec), TraceID: rec.TraceID, Dedup: s.dedupOf(rec)}
	if res := rec.Result; res != nil {
		v.Usage = res.Usage
		switch {
		case rec.State == kv.Completed && res.Status == http.StatusOK:
			body := res.Body
			if rec.Stream {
				if body, err = wireOf(rec.API).assemble(res.Events, res.UsageEvent); err != nil {
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

// tokensOut is the output tokens of a record: the backend's usage once there is one (a
// non-stream execution counts no events), else the events seen so far.
func tokensOut(rec *kv.Record) int {
	if res := rec.Result; res != nil && res.Usage != nil && res.Usage.CompletionTokens > 0 {
		return res.Usage.CompletionTokens
	}
	return rec.Tokens
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
	rec, err := s.intents.Cancel(c.UserContext(), tenant, c.Params("id"), func(api string) []byte {
		return wireOf(api).errorBody(errJobCancelled)
	})
	if err != nil {
		return err
	}
	return c.JSON(fiber.Map{"id": rec.JobID, "object": "job", "status": jobStatus(rec)})
}

// getIdempotency is GET /v1/idempotency/{key}: where the work of a key stands.
func (s *Server) getIdempotency(c *fiber.Ctx) error {
	tenant, err := s.authenticate(c)
	if err != nil {
		return err
	}
	raw, err := url.PathUnescape(c.Params("key"))
	if err != nil {
		return errKeyNotPathText
	}
	key, err := parseIdempotencyKey(raw)
	if err != nil {
		return keyPathInvalid(err)
	}
	recKey, rec, err := s.intents.Lookup(c.UserContext(), tenant, key)
	if err != nil {
		return err
	}
	rec, prog := s.intents.WithProgress(c.UserContext(), recKey, rec)
	out := fiber.Map{"key": key, "state": rec.State, "job_id": rec.JobID, "epoch": rec.Epoch,
		"created": rec.Created.UTC().Format(time.RFC3339Nano), "started": rec.EpochStarted.UTC().Format(time.RFC3339Nano),
		"attempts": rec.Attempts, "takeovers": rec.Takeovers, "progress": rec.Progress, "job_status": jobStatus(rec),
		"tokens_so_far": tokensOut(rec), "stream": rec.Stream, "model": rec.Model, "backend": rec.Backend}
	if rec.State == kv.Pending {
		out["lease_until"] = rec.LeaseUntil.UTC().Format(time.RFC3339Nano)
	}
	if prog != nil {
		out["sent"] = prog.Sent.UTC().Format(time.RFC3339Nano) // when the current attempt was sent
	}
	if res := rec.Result; res != nil {
		out["status"] = res.Status
		if rec.State == kv.Failed && res.Partial {
			// The clients got 200 and part of the stream, then an error event: the outcome
			// is the backend's broken stream, not a success.
			out["status"], out["partial"] = http.StatusBadGateway, true
		}
		if rec.State == kv.Failed && len(res.Body) > 0 {
			out["error"] = errorObject(res.Body)
		}
		out["finished"] = res.Finished.UTC().Format(time.RFC3339Nano)
	}
	if rec.Cancelled {
		out["cancelled"] = true
	}
	out["dedup"] = s.dedupOf(rec)
	return c.JSON(out)
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
	key, rec, err := s.loadTenantJob(c, tenant)
	if err != nil {
		return err
	}
	if rec.API == apiEmbeddings || rec.API == apiPassthrough {
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
	if rec.State != kv.Pending {
		events, err := finishedEvents(rec)
		if err != nil {
			return err
		}
		if after >= len(splitFrames(events))-1 {
			return c.SendStatus(http.StatusNoContent)
		}
		return eventStream(after).whole(c, events)
	}
	fl, release, err := s.intents.FollowStream(c.UserContext(), rec.Tenant, key, rec.JobID, rec.Epoch)
	if err != nil {
		return err
	}
	out := eventStream(after)
	core, log, w, epoch := s.intents, s.log, wireOf(rec.API), rec.Epoch
	out.live(c, fl, s.writeTimeout, func() {
		defer release()
		ctx, cancel := context.WithTimeout(context.Background(), maxGeneration)
		defer cancel()
		// A terminal chunk that never comes: the record says how the epoch ended (recordend.go).
		idle := func() error { return recordCheck(ctx, core, key, epoch)() }
		for {
			ch, err := out.nextChunk(ctx, idle)
			rec, ended := endedRecord(err)
			if err != nil && !ended && !errors.Is(err, jobs.ErrEnded) && !errors.Is(err, jobs.ErrHubClosed) {
				return // client gone or out of time
			}
			if err != nil || ch.Kind == jobs.KindFence {
				// Taken over, the feed ended, or the record says the execution ended: follow
				// the new epoch if this client got nothing of this one, end from the record if
				// it finished this epoch (or this client got nothing yet); anything else ends
				// the stream with an error event.
				if !ended {
					rec, _ = core.Record(ctx, key)
				}
				switch {
				case rec == nil:
				case rec.State == kv.Pending && out.next == 0:
					out.follow(nil)
					var fl *jobs.Follower
					if fl, err = core.Follow(ctx, key, rec.JobID, rec.Epoch); err == nil {
						out.follow(fl)
						epoch = rec.Epoch
						continue
					}
				case rec.State != kv.Pending && (out.next == 0 || rec.Epoch == epoch):
					if events, ferr := finishedEvents(rec); ferr == nil {
						// The events sent so far are the record's first ones: skip them.
						out.after, out.next = max(out.after, out.next-1), 0
						_ = out.end(events)
						return
					}
				}
				log.Warn().Err(err).Str(fieldKey, key).Msg("job events: execution interrupted")
				_ = out.end(w.errorFrame(w.restarted()))
				return
			}
			var events []byte
			switch ch.Kind {
			case jobs.KindData, jobs.KindUsage:
				events = ch.Payload
			case jobs.KindDone:
				events = w.doneFrame()
			case jobs.KindResult:
				if ch.Status == http.StatusOK {
					if synth, err := synthesizedEvents(w, ch.Payload); err == nil {
						events = synth
						break
					}
				}
				events = w.errorFrame(ch.Payload)
			case jobs.KindError:
				events = w.errorFrame(ch.Payload)
			}
			if ch.Terminal() {
				_ = out.end(events)
				return
			}
			if out.write(events) != nil {
				return
			}
		}
	})
	return nil
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
func finishedEvents(rec *kv.Record) ([]byte, error) {
	res := rec.Result
	if res == nil {
		return nil, fmt.Errorf("httpapi: record of %s has no result", rec.JobID)
	}
	w := wireOf(rec.API)
	if (rec.State == kv.Failed && !res.Partial) || (rec.State == kv.Completed && res.Status != http.StatusOK) {
		return w.errorFrame(res.Body), nil
	}
	if !rec.Stream {
		return synthesizedEvents(w, res.Body)
	}
	all := append(append([]byte{}, res.Events...), res.UsageEvent...)
	if rec.State == kv.Failed {
		return append(all, w.errorFrame(res.Body)...), nil
	}
	return append(all, w.doneFrame()...), nil
}

// jobStatus maps a record to the jobs API status.
func jobStatus(rec *kv.Record) string {
	switch {
	case rec == nil:
		return "queued"
	case rec.Cancelled:
		return "cancelled"
	case rec.State == kv.Completed:
		return "completed"
	case rec.State == kv.Failed:
		return "failed"
	case rec.Progress == kv.ProgressQueued:
		return "queued"
	}
	return "running"
}
