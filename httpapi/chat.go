package httpapi

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// Outcomes reported in Oncegate-Idempotency.
const (
	outcomeCreated  = "created"
	outcomeJoined   = "joined"
	outcomeReplayed = "replayed"
	outcomeBypassed = "bypassed"
)

// generation is an owned copy of everything a generation request needs after the handler's
// *fiber.Ctx is gone (Fiber reuses its memory).
type generation struct {
	tenant       string
	echoKey      string // Idempotency-Key response header
	recKey       string
	fingerprint  string
	auto         bool
	retry        bool
	bypass       bool
	async        bool
	model        string
	api          string // "openai" or "anthropic": the request's wire format
	backends     []string
	degraded     *kv.Degraded
	header       map[string][]string // passed through to the backend
	deadline     time.Time           // the client's overall deadline (Oncegate-Timeout)
	stream       bool
	includeUsage bool
	maxTokens    int // 0 = not set
	body         []byte
}

// chatCompletions is POST /v1/chat/completions; messages is POST /v1/messages (Anthropic).
// Both go the same way: claim, job, chunks; only the wire format differs.
func (s *Server) chatCompletions(c *fiber.Ctx) error { return s.generate(c, apiOpenAI) }

func (s *Server) messages(c *fiber.Ctx) error { return s.generate(c, apiAnthropic) }

func (s *Server) generate(c *fiber.Ctx, api string) error {
	g, err := s.parseGeneration(c, api)
	if err != nil {
		return err
	}
	adm, err := s.admit(c.UserContext(), g)
	if err != nil {
		return err
	}
	if g.async {
		return s.respondAccepted(c, g, adm)
	}
	return s.deliver(c, g, adm)
}

// parseGeneration authenticates, validates and copies the request. It changes no state.
func (s *Server) parseGeneration(c *fiber.Ctx, api string) (*generation, error) {
	if ct := c.Get(fiber.HeaderContentType); !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), fiber.MIMEApplicationJSON) {
		return nil, &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error", Code: "unsupported_media_type",
			Message: "Content-Type must be application/json"}
	}
	tenant, err := s.authenticate(c)
	if err != nil {
		return nil, err
	}
	g := &generation{tenant: tenant, body: bytes.Clone(c.Body())}
	fp, fields, err := canonicalFingerprint(g.body)
	if err != nil {
		return nil, badRequest("invalid_json", "", "request body is not a valid JSON object: "+err.Error())
	}
	model, ok := fields.str("model")
	if !ok || model == "" {
		return nil, badRequest("missing_required_parameter", "model", "you must provide a model parameter")
	}
	if !fields.nonEmptyArray("messages") {
		return nil, badRequest("missing_required_parameter", "messages", "messages must be a non-empty array")
	}
	maxTokens, err := tokenLimit(fields, "max_tokens")
	if err != nil {
		return nil, err
	}
	if api == apiAnthropic && maxTokens == 0 {
		return nil, badRequest("missing_required_parameter", "max_tokens", "max_tokens: a positive integer is required")
	}
	maxCompletion, err := tokenLimit(fields, "max_completion_tokens")
	if err != nil {
		return nil, err
	}
	g.maxTokens = cmp.Or(maxCompletion, maxTokens) // the newer parameter wins
	if v, present := fields["stream"]; present && string(v) != "null" {
		if string(v) != "true" && string(v) != "false" {
			return nil, badRequest("invalid_type", "stream", "stream must be a boolean")
		}
		g.stream = string(v) == "true"
	}
	if so, ok := fields.object("stream_options"); ok {
		g.includeUsage, _ = so["include_usage"].(bool)
	}
	rt, ok := s.router.Resolve(model)
	backends := s.compatible(rt.Backends, api)
	if !ok || len(backends) == 0 {
		return nil, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("The model `%s` does not exist or is not served by this gateway on this API", model)}
	}
	g.model, g.backends, g.fingerprint, g.api = model, backends, fp, api
	if api == apiAnthropic {
		for _, h := range []string{"anthropic-version", "anthropic-beta"} {
			if v := c.Get(h); v != "" {
				if g.header == nil {
					g.header = map[string][]string{}
				}
				g.header[h] = []string{strings.Clone(v)}
			}
		}
	}
	if d := rt.Degraded; d != nil {
		g.degraded = &kv.Degraded{Message: d.Message, RetryAfter: int((d.RetryAfter.D() + time.Second - 1) / time.Second)}
	}
	if err := s.readDeadline(c, g); err != nil {
		return nil, err
	}

	g.bypass = !rt.Dedup || strings.EqualFold(c.Get("X-Allow-Duplicate"), "true")
	// A key is validated even when the request bypasses deduplication: a malformed key is the
	// client's mistake either way, and a valid one is echoed (admit gives a bypass its own record).
	raw, present, err := idempotencyKeyHeader(c)
	if err == nil && present {
		g.echoKey, err = parseIdempotencyKey(raw)
	}
	if err != nil {
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_idempotency_key",
			Message: err.Error(), ShouldRetry: &retryNo}
	}
	switch {
	case g.bypass: // its record key is made per execution by admit
	case present:
		g.recKey = recordKey(tenant, g.echoKey)
	default:
		g.auto = true
		g.recKey = hashParts(tenant, "auto", c.Method(), c.Path(), fp)
		g.echoKey = autoKeyPrefix + g.recKey
	}
	g.retry = s.isRetry(c)
	if preferAsync(c.Get("Prefer")) {
		g.setAsync()
	}
	return g, nil
}

// compatible keeps the backends of a route that speak api: Anthropic backends serve only
// /v1/messages, OpenAI-compatible ones only /v1/chat/completions; another oncegate and the
// mock serve both.
func (s *Server) compatible(names []string, api string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		b, ok := s.router.Backend(n)
		if !ok {
			continue
		}
		switch b.Type {
		case config.TypeAnthropic:
			if api != apiAnthropic {
				continue
			}
		case config.TypeOpenAI:
			if api != apiOpenAI {
				continue
			}
		}
		out = append(out, n)
	}
	return out
}

// maxTokenLimit bounds max_tokens and max_completion_tokens (2^31-1): far above any model's
// output, and it keeps the value an int32 for every backend and an int in estimates and budgets.
const maxTokenLimit = 1<<31 - 1

// tokenLimit reads the token-limit parameter name: 0 when absent or null, else an integer
// written as one (no fraction, no exponent) from 1 to maxTokenLimit, or a 400 naming name (and
// never quoting the value, which may be 5,000 digits).
func tokenLimit(fields bodyFields, name string) (int, error) {
	raw, ok := fields[name]
	if !ok || string(raw) == "null" {
		return 0, nil
	}
	n, ok := fields.number(name)
	if !ok || strings.ContainsAny(string(n), ".eE") {
		return 0, badRequest("invalid_type", name, fmt.Sprintf("Invalid '%s': expected an integer.", name))
	}
	v, err := n.Int64()
	switch {
	case n[0] == '-' || err == nil && v < 1:
		return 0, badRequest("integer_below_min_value", name, fmt.Sprintf("Invalid '%s': expected a value >= 1.", name))
	case err != nil || v > maxTokenLimit:
		return 0, badRequest("integer_above_max_value", name, fmt.Sprintf("Invalid '%s': expected a value <= %d.", name, maxTokenLimit))
	}
	return int(v), nil
}

// Wire formats of generation requests.
const (
	apiOpenAI    = "openai"
	apiAnthropic = "anthropic"
)

// readDeadline reads Oncegate-Timeout (seconds): the client's overall deadline for this
// intent, across its retries, which bounds the backend attempts. Per-attempt SDK timeouts
// (x-stainless-timeout) are deliberately not used: a retry after one of them must find the
// execution still running.
func (s *Server) readDeadline(c *fiber.Ctx, g *generation) error {
	v := c.Get("Oncegate-Timeout")
	if v == "" {
		return nil
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil || secs <= 0 || secs > 24*3600 {
		return badRequest("invalid_header", "Oncegate-Timeout", "Oncegate-Timeout must be a number of seconds between 0 and 86400")
	}
	g.deadline = s.now().Add(time.Duration(secs * float64(time.Second)))
	return nil
}

// isRetry: the request declares itself a retry of an earlier attempt.
func (s *Server) isRetry(c *fiber.Ctx) bool {
	if n, err := strconv.Atoi(c.Get("x-stainless-retry-count")); err == nil && n >= 1 {
		return true
	}
	for _, h := range s.idem.RetryHeaders {
		if v := c.Get(h); v != "" && v != "0" && !strings.EqualFold(v, "false") {
			return true
		}
	}
	return false
}

// setAsync makes g a background job. It executes streamed (nobody waits for the whole
// body, and live events and progress come from the stream); the fingerprint ignores the mode.
func (g *generation) setAsync() {
	g.async, g.stream = true, true
}

func preferAsync(prefer string) bool {
	for _, p := range strings.Split(prefer, ",") {
		if strings.EqualFold(strings.TrimSpace(strings.SplitN(p, ";", 2)[0]), "respond-async") {
			return true
		}
	}
	return false
}

// admission is the decision for one request: what it is attached to.
type admission struct {
	outcome string
	key     string
	rec     *kv.Record
	fl      *jobs.Follower // created and joined
	jobID   string
	// settle ends the budget reservation of a new execution (nil otherwise); call it once.
	settle func()
}

// done settles the admission's budget reservation, if any.
func (a *admission) done() {
	if a.settle != nil {
		a.settle()
		a.settle = nil
	}
}

var errGone = errors.New("record vanished")

// admit claims the key or finds what already holds it. Only the claim and the job publish
// write; replays and joins read.
func (s *Server) admit(ctx context.Context, g *generation) (*admission, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if g.bypass {
		jobID := jobs.NewID()
		g.recKey = hashParts(g.tenant, "bypass", jobID) // unique per execution, whatever the key
		if g.echoKey == "" {
			g.echoKey = autoKeyPrefix + g.recKey
		}
		return s.create(ctx, g, g.recKey, jobID, outcomeBypassed)
	}
	if rec, rev, ok := s.finishedRecord(g); ok {
		adm, err := s.attach(ctx, g, &kv.ExistsError{Record: rec, Rev: rev})
		if !errors.Is(err, errGone) && !errors.Is(err, kv.ErrConflict) {
			return adm, err
		}
		s.finished.forget(g.recKey)
	}
	if adm, ok := s.joinLocal(g); ok {
		return adm, nil
	}
	for attempt := 0; attempt < 5; attempt++ {
		adm, err := s.create(ctx, g, g.recKey, jobs.NewID(), outcomeCreated)
		if !errors.Is(err, kv.ErrExists) {
			return adm, err
		}
		var held *kv.ExistsError // the claim already read the record that holds the key
		errors.As(err, &held)
		adm, err = s.attach(ctx, g, held)
		if errors.Is(err, errGone) || errors.Is(err, kv.ErrConflict) {
			continue // expired or changed under us: decide again
		}
		if err == nil && held != nil && adm.outcome == outcomeReplayed && !g.auto {
			s.finished.put(g.recKey, held.Record, held.Rev, s.idem.TTL.D(), s.now())
		}
		return adm, err
	}
	return nil, unavailable("the idempotency key is contended; retry")
}

// newRecord is a PENDING claim for g: it names the job, the epoch, the fingerprint, a lease,
// and carries the request so the job can be re-driven from it.
func (s *Server) newRecord(g *generation, jobID string, epoch int) *kv.Record {
	now := s.now()
	return &kv.Record{State: kv.Pending, Tenant: g.tenant, JobID: jobID, Epoch: epoch, Fingerprint: g.fingerprint,
		Owner: kv.NewOwner(), Auto: g.auto, Bypassed: g.bypass, Created: now, EpochStarted: now,
		LeaseUntil: now.Add(s.idem.Lease.D()), Progress: kv.ProgressQueued, Model: g.model, API: g.api,
		Backends: g.backends, Degraded: g.degraded, Stream: g.stream, Request: g.body, Header: g.header, Deadline: g.deadline}
}

// create claims key with a new record and publishes its job; kv.ErrExists if taken.
func (s *Server) create(ctx context.Context, g *generation, key, jobID, outcome string) (*admission, error) {
	settle, err := s.reserve(ctx, g)
	if err != nil {
		// A copy of an intent that already exists is never refused by a budget.
		if _, _, gerr := s.store.Get(ctx, key); gerr == nil {
			return nil, fmt.Errorf("httpapi: claim: %w", kv.ErrExists)
		}
		return nil, err
	}
	rec := s.newRecord(g, jobID, 1)
	data, err := kv.Encode(rec) // written by the claim, and the body of the job message
	if err != nil {
		settle(0)
		return nil, fmt.Errorf("httpapi: claim: %w", err)
	}
	rev, err := s.store.ClaimEncoded(ctx, key, rec, data)
	if err != nil {
		settle(0)
		if errors.Is(err, kv.ErrExists) {
			return nil, err
		}
		return nil, fmt.Errorf("httpapi: claim: %w", err)
	}
	return s.launchSettled(ctx, g, key, rec, rev, data, outcome, true, settle)
}

// launchSettled launches a new execution holding a budget reservation.
func (s *Server) launchSettled(ctx context.Context, g *generation, key string, rec *kv.Record, rev uint64, data []byte, outcome string, newJob bool, settle func(int64)) (*admission, error) {
	adm, err := s.launch(ctx, g, key, rec, rev, data, outcome, newJob)
	if err != nil {
		settle(0)
		return nil, err
	}
	estimate := s.estimate(g)
	adm.settle = func() { settle(estimate) } // the ledger charge replaces it once written
	return adm, nil
}

// launch subscribes to the epoch's chunks, then publishes its job (that order means no chunk
// can be missed), and indexes the job id. data is rec as stored at rev (nil: encode it here).
func (s *Server) launch(ctx context.Context, g *generation, key string, rec *kv.Record, rev uint64, data []byte, outcome string, newJob bool) (*admission, error) {
	if data == nil {
		var err error
		if data, err = kv.Encode(rec); err != nil {
			s.release(key, rec, rev)
			return nil, fmt.Errorf("httpapi: %w", err)
		}
	}
	job := intent.JobEncoded(key, rec, rev, data)
	fl, err := s.hub.Open(ctx, job.Subject())
	if err != nil {
		s.release(key, rec, rev)
		return nil, fmt.Errorf("httpapi: follow %s: %w", job.ID, err)
	}
	if err := jobs.Submit(ctx, s.js, job); err != nil {
		fl.Close()
		s.release(key, rec, rev)
		return nil, fmt.Errorf("httpapi: %w", err)
	}
	if newJob {
		if err := s.store.IndexJob(ctx, job.ID, key, g.async); err != nil {
			s.log.Warn().Err(err).Str(fieldJobID, job.ID).Msg("indexing job id")
		}
	}
	s.remember(key, rec)
	return &admission{outcome: outcome, key: key, rec: rec, fl: fl, jobID: job.ID}, nil
}

// release marks a claim whose job could not be published as a retryable failure, so the
// client's retry re-executes.
func (s *Server) release(key string, rec *kv.Record, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	failed := *rec
	failed.State, failed.Request = kv.Failed, nil
	failed.Result = &kv.Result{Status: http.StatusServiceUnavailable, Retryable: true}
	if _, err := s.store.Update(ctx, key, &failed, rev); err != nil {
		s.log.Warn().Err(err).Str(fieldKey, key).Msg("releasing claim")
	}
}

// attach handles a key that already has a record.
func (s *Server) attach(ctx context.Context, g *generation, held *kv.ExistsError) (*admission, error) {
	var rec *kv.Record
	var rev uint64
	if held != nil {
		rec, rev = held.Record, held.Rev
	} else {
		var err error
		rec, rev, err = s.store.Get(ctx, g.recKey)
		if errors.Is(err, kv.ErrNotFound) {
			return nil, errGone
		}
		if err != nil {
			return nil, fmt.Errorf("httpapi: read record: %w", err)
		}
	}
	if rec.Tenant != g.tenant {
		// Only a crafted "auto-" key can name another tenant's record: it does not exist for them.
		return nil, &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused",
			Message: "this Idempotency-Key was used with a different request", ShouldRetry: &retryNo}
	}
	if rec.Fingerprint != g.fingerprint {
		return nil, &apiError{Status: http.StatusUnprocessableEntity, Type: "invalid_request_error", Code: "idempotency_key_reused",
			Message: "this Idempotency-Key was already used with a different request body", ShouldRetry: &retryNo}
	}
	now := s.now()
	if g.auto && !g.retry && now.Sub(rec.Created) > s.idem.AutoWindow.D() {
		// Identical content after the window is a new intent, not a copy.
		if rec.State == kv.Pending {
			jobID := jobs.NewID()
			return s.create(ctx, g, hashParts(g.recKey, jobID), jobID, outcomeCreated)
		}
		s.archive(ctx, g.recKey, rec)
		return s.reclaim(ctx, g, rec, rev, jobs.NewID())
	}
	switch rec.State {
	case kv.Pending:
		if rec.LeaseExpired(now) && !s.stillQueued(ctx, g.recKey) {
			job, nrec, nrev, err := intent.TakeOver(ctx, s.js, s.store, g.recKey, rec, rev, now, s.idem.Lease.D())
			if err != nil {
				return nil, err
			}
			s.log.Warn().Str(fieldJobID, job.ID).Int("epoch", job.Epoch).Msg("lease expired; execution re-driven by a client request")
			return s.launch(ctx, g, g.recKey, nrec, nrev, job.Record, outcomeJoined, false)
		}
		fl, err := s.hub.Join(ctx, jobs.ChunkSubject(g.recKey, rec.Epoch))
		if err != nil {
			return nil, fmt.Errorf("httpapi: join: %w", err)
		}
		s.remember(g.recKey, rec)
		return &admission{outcome: outcomeJoined, key: g.recKey, rec: rec, fl: fl, jobID: rec.JobID}, nil
	case kv.Failed:
		if rec.Result != nil && rec.Result.Retryable && !rec.Cancelled {
			return s.reclaim(ctx, g, rec, rev, rec.JobID)
		}
	}
	return &admission{outcome: outcomeReplayed, key: g.recKey, rec: rec, jobID: rec.JobID}, nil
}

// archive keeps a finished execution reachable by its job id before its auto key moves on to
// a newer identical request (the auto key matches the most recent one).
func (s *Server) archive(ctx context.Context, key string, rec *kv.Record) {
	archived := hashParts(key, rec.JobID)
	if _, err := s.store.Claim(ctx, archived, rec); err != nil && !errors.Is(err, kv.ErrExists) {
		s.log.Warn().Err(err).Str(fieldJobID, rec.JobID).Msg("archiving a finished execution")
		return
	}
	if err := s.store.IndexJob(ctx, rec.JobID, archived, true); err != nil {
		s.log.Warn().Err(err).Str(fieldJobID, rec.JobID).Msg("re-indexing an archived execution")
	}
}

// stillQueued: the job of key is still in JOBS (waiting for a worker, or delivered and not
// acked), so it will run or be redelivered; an expired lease alone does not make it lost.
func (s *Server) stillQueued(ctx context.Context, key string) bool {
	queued, err := jobs.Queued(ctx, s.js, key)
	return err != nil || queued // when unsure, do not take over
}

// reclaim replaces a finished record by compare-and-set with a new PENDING epoch (epochs keep
// growing on one key, so chunk subjects never repeat).
func (s *Server) reclaim(ctx context.Context, g *generation, old *kv.Record, rev uint64, jobID string) (*admission, error) {
	rec := s.newRecord(g, jobID, old.Epoch+1)
	if jobID == old.JobID {
		rec.Created = old.Created
	}
	settle, err := s.reserve(ctx, g)
	if err != nil {
		return nil, err
	}
	nrev, err := s.store.Update(ctx, g.recKey, rec, rev)
	if err != nil {
		settle(0)
		return nil, err
	}
	return s.launchSettled(ctx, g, g.recKey, rec, nrev, nil, outcomeCreated, jobID != old.JobID, settle)
}

// Log field names.
const (
	fieldJobID = "job_id"
	fieldKey   = "idem_key_hash"
)
