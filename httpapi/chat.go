package httpapi

import (
	"cmp"
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/telemetry"
	"github.com/oncegate/oncegate/internal/tracing"
)

// generation is an owned copy of everything a generation request needs after the handler's
// *fiber.Ctx is gone (Fiber reuses its memory): what admission decides on, and what only the
// answer needs.
type generation struct {
	intent.Request
	echoKey      string // Idempotency-Key response header
	live         bool   // answered by a live stream (streamLive), which outlives the handler
	includeUsage bool
	obs          observation
}

// chatCompletions is POST /v1/chat/completions; messages is POST /v1/messages (Anthropic).
// Both go the same way: claim, job, chunks; only the wire format differs.
func (s *Server) chatCompletions(c *fiber.Ctx) error { return s.generate(c, apiOpenAI) }

func (s *Server) messages(c *fiber.Ctx) error { return s.generate(c, apiAnthropic) }

func (s *Server) generate(c *fiber.Ctx, api string) error {
	ctx, obs := s.startObservation(c, routeOf(api), telemetry.APIOf(api))
	g, err := s.parseGeneration(c, api)
	if err != nil {
		s.countError(&obs, nil, err)
		return err
	}
	g.observe(ctx, obs)
	g.obs.stream = g.Stream && !g.Async
	adm, err := s.admit(ctx, g)
	if err != nil {
		s.countError(&g.obs, nil, err)
		return err
	}
	if g.Async {
		err = s.respondAccepted(c, g, adm)
	} else {
		err = s.deliver(c, g, adm)
	}
	switch {
	case err != nil:
		s.countError(&g.obs, adm, err)
	case !g.live: // a live stream is counted when it ends (streamLive)
		s.countAnswer(c, &g.obs, adm)
	}
	return err
}

// observe attaches the request's observation, and gives the record its trace: the execution's
// span continues this request's (its worker reads the traceparent from the record).
func (g *generation) observe(ctx context.Context, obs observation) {
	obs.tenant, obs.key = g.Tenant, g.Key
	g.obs, g.TraceID = obs, obs.traceID
	if g.Header == nil {
		g.Header = map[string][]string{}
	}
	tracing.Inject(ctx, g.Header)
}

// parseGeneration authenticates, validates and copies the request. It changes no state.
func (s *Server) parseGeneration(c *fiber.Ctx, api string) (*generation, error) {
	g, fields, err := s.readJSONRequestWith(c, isTransportField, checkTokenLimit)
	if err != nil {
		return nil, err
	}
	model, err := fields.model()
	if err != nil {
		return nil, err
	}
	if !fields.nonEmptyArray("messages") {
		return nil, errNoMessages
	}
	maxTokens, err := tokenLimit(fields, "max_tokens")
	if err != nil {
		return nil, err
	}
	if api == apiAnthropic && maxTokens == 0 {
		return nil, errNoMaxTokens
	}
	maxCompletion, err := tokenLimit(fields, "max_completion_tokens")
	if err != nil {
		return nil, err
	}
	g.MaxTokens = cmp.Or(maxCompletion, maxTokens) // the newer parameter wins
	if v, present := fields["stream"]; present && string(v) != "null" {
		if string(v) != "true" && string(v) != "false" {
			return nil, errStreamNotBool
		}
		g.Stream = string(v) == "true"
	}
	if so, ok := fields.object("stream_options"); ok {
		g.includeUsage, _ = so["include_usage"].(bool)
	}
	rt, ok := s.router.Resolve(model)
	backends := s.compatible(rt.Backends, api)
	if !ok || len(backends) == 0 {
		return nil, modelNotFound(model)
	}
	g.Model, g.Backends, g.API = model, backends, api
	if api == apiAnthropic {
		for _, h := range []string{"anthropic-version", "anthropic-beta"} {
			if v := c.Get(h); v != "" {
				if g.Header == nil {
					g.Header = map[string][]string{}
				}
				g.Header[h] = []string{strings.Clone(v)}
			}
		}
	}
	if err := s.readIntent(c, g, rt); err != nil {
		return nil, err
	}
	return g, nil
}

// readJSONRequest authenticates a request whose body is a JSON object and takes it (takeBody):
// the tenant, the body and its fingerprint (canonicalFingerprint), and the body's top-level
// members.
func (s *Server) readJSONRequest(c *fiber.Ctx) (*generation, bodyFields, error) {
	return s.readJSONRequestWith(c, isTransportField, nil)
}

// readJSONRequestWith is readJSONRequest with the fingerprint's transport fields (see
// fingerprintOf), and the API's check of a member whose number the fingerprint refuses (see
// refusedBody; nil: none).
func (s *Server) readJSONRequestWith(c *fiber.Ctx, transport func(string) bool, check paramCheck) (*generation, bodyFields, error) {
	if ct := c.Get(fiber.HeaderContentType); !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), fiber.MIMEApplicationJSON) {
		return nil, nil, errUnsupportedMediaType
	}
	tenant, err := s.authenticate(c)
	if err != nil {
		return nil, nil, err
	}
	body, err := s.takeBody(c)
	if err != nil {
		return nil, nil, err
	}
	g := &generation{Request: intent.Request{Tenant: tenant, Body: body}}
	fp, fields, err := fingerprintOf(g.Body, transport)
	if err != nil {
		return nil, nil, refusedBody(g.Body, err, check)
	}
	g.Fingerprint = fp
	return g, fields, nil
}

// readIntent reads what every generation API says the same way: the route's degraded answer,
// the deadline, deduplication off, the idempotency key (or the auto key of the content on
// this method and path), the retry headers and Prefer: respond-async.
func (s *Server) readIntent(c *fiber.Ctx, g *generation, rt config.RouteTarget) error {
	if d := rt.Degraded; d != nil {
		g.Degraded = &intent.Degraded{Message: d.Message, RetryAfter: int((d.RetryAfter.D() + time.Second - 1) / time.Second)}
	}
	if err := s.readDeadline(c, g); err != nil {
		return err
	}
	g.ClientTimeout = clientTimeout(c)

	g.Arrived = c.Context().Time() // when fasthttp read the request's head: the window is judged from it
	g.Bypass = !rt.Dedup || strings.EqualFold(c.Get("X-Allow-Duplicate"), "true")
	// A key is validated even when the request bypasses deduplication: a malformed key is the
	// client's mistake either way, and a valid one is echoed (admit gives a bypass its own record).
	raw, present, err := idempotencyKeyHeader(c)
	if err == nil && present {
		g.echoKey, err = parseIdempotencyKey(raw)
	}
	if err != nil {
		return keyHeaderInvalid(err)
	}
	g.RetryHeader, g.Retry = s.retryHeader(c)
	switch {
	case g.Bypass: // its record key is made per execution by intent.Admit
		if g.RetryHeader != "" { // an SDK that retries it: its retries can find it (intent/bypass.go)
			g.ContentKey = intent.AutoKey(s.intents.Partitions(), g.Tenant, c.Method(), c.Path(), g.Fingerprint)
		}
	case present:
		g.Key = intent.RecordKey(s.intents.Partitions(), g.Tenant, g.echoKey)
	default:
		g.setAuto(s.intents.Partitions(), c.Method(), c.Path())
	}
	if preferAsync(c.Get("Prefer")) {
		g.setAsync()
	}
	return nil
}

// compatible keeps the backends of a route that speak api: Anthropic backends serve only
// /v1/messages, OpenAI-compatible ones only /v1/chat/completions; another oncegate and the
// mock serve both; the Responses API as it is only backends configured responses: native;
// and no backend whose type no dialect serves api on (Registry.For: Gemini and Azure speak
// Chat Completions only).
func (s *Server) compatible(names []string, api string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		b, ok := s.router.Backend(n)
		if !ok {
			continue
		}
		if s.dialects != nil {
			if _, err := s.dialects.For(b.Type, api); err != nil {
				continue
			}
		}
		switch {
		case api == apiResponses:
			if b.Responses != config.ResponsesNative {
				continue
			}
		case b.Type == config.TypeAnthropic:
			if api != apiAnthropic {
				continue
			}
		case b.Type == config.TypeOpenAI:
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
		return 0, tokenNotInteger(name)
	}
	v, err := n.Int64()
	switch {
	case n[0] == '-' || err == nil && v < 1:
		return 0, tokenBelowMin(name)
	case err != nil || v > maxTokenLimit:
		return 0, tokenAboveMax(name)
	}
	return int(v), nil
}

// checkTokenLimit is tokenLimit's answer to value when name is a token limit (a paramCheck).
func checkTokenLimit(name string, value []byte) error {
	if name != "max_tokens" && name != "max_completion_tokens" {
		return nil
	}
	_, err := tokenLimit(bodyFields{name: value}, name)
	return err
}

// Wire formats of generation requests.
const (
	apiOpenAI    = "openai"
	apiAnthropic = "anthropic"
	// apiResponses: a Responses request sent as it is to a backend that serves the API
	// (responses: native).
	apiResponses = "responses"
)

// readDeadline reads Oncegate-Timeout (seconds): the client's overall deadline for this
// intent, across its retries, which bounds the backend attempts. Per-attempt SDK timeouts
// (x-stainless-timeout) are deliberately not used for it: a retry after one of them must find
// the execution still running. They bound only how long admission waits for the store
// (clientTimeout).
func (s *Server) readDeadline(c *fiber.Ctx, g *generation) error {
	v := c.Get("Oncegate-Timeout")
	if v == "" {
		return nil
	}
	secs, err := strconv.ParseFloat(v, 64)
	if err != nil || secs <= 0 || secs > 24*3600 {
		return errBadTimeout
	}
	g.Deadline = s.now().Add(time.Duration(secs * float64(time.Second)))
	return nil
}

// clientTimeout is how long the client says it waits for this attempt: the official SDKs'
// X-Stainless-Timeout (the Go and Node SDKs; seconds) or x-stainless-read-timeout (the Python
// SDK; seconds, fractional); 0 when it says nothing readable. It is the SDK's own report, not a
// request parameter, so a value that does not parse is ignored rather than refused.
func clientTimeout(c *fiber.Ctx) time.Duration {
	for _, h := range []string{"X-Stainless-Timeout", "X-Stainless-Read-Timeout"} {
		secs, err := strconv.ParseFloat(c.Get(h), 64)
		if err == nil && secs > 0 && secs <= 24*3600 {
			return time.Duration(secs * float64(time.Second))
		}
	}
	return 0
}

// retryHeader reads the headers that say which attempt a request is: an official SDK's
// x-stainless-retry-count (a retry from 1), or a configured retry header (a retry unless "",
// "0" or "false"). name is the header that declares it a retry, else the first one sent ("":
// none); retry says it is a retry of an earlier attempt.
func (s *Server) retryHeader(c *fiber.Ctx) (name string, retry bool) {
	if v := c.Get(intent.SDKRetryHeader); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 1 {
			return intent.SDKRetryHeader, true
		}
		name = intent.SDKRetryHeader
	}
	for _, h := range s.idem.RetryHeaders {
		v := c.Get(h)
		if v == "" {
			continue
		}
		if v != "0" && !strings.EqualFold(v, "false") {
			return h, true
		}
		if name == "" {
			name = h
		}
	}
	return name, false
}

// setAsync makes g a background job. It executes streamed (nobody waits for the whole
// body, and live events and progress come from the stream); the fingerprint ignores the mode.
func (g *generation) setAsync() {
	g.Async, g.Stream = true, true
}

// setAuto gives a request sent without an Idempotency-Key the key of its content on the
// endpoint method and path, and echoes it.
func (g *generation) setAuto(parts int, method, path string) {
	g.Auto = true
	g.Key = intent.AutoKey(parts, g.Tenant, method, path, g.Fingerprint)
	g.echoKey = intent.AutoKeyPrefix + g.Key
}

// admit hands the request to the exactly-once core. A bypass without a key of its own echoes
// the record key its execution got. The dashboard counts the outcome here, as it is decided.
func (s *Server) admit(ctx context.Context, g *generation) (*intent.Admission, error) {
	adm, err := s.intents.Admit(ctx, &g.Request)
	g.obs.admitted = time.Since(g.obs.start)
	if err != nil {
		return nil, err
	}
	if out, ok := telemetry.OutcomeOf(string(adm.Outcome)); ok {
		s.dashTally.Request(g.obs.tenant, out)
		g.obs.dashCounted = true
	}
	if g.echoKey == "" {
		g.echoKey = intent.AutoKeyPrefix + adm.Key
	}
	return adm, nil
}

func preferAsync(prefer string) bool {
	for _, p := range strings.Split(prefer, ",") {
		if strings.EqualFold(strings.TrimSpace(strings.SplitN(p, ";", 2)[0]), "respond-async") {
			return true
		}
	}
	return false
}

// Log field names.
const (
	fieldJobID = "job_id"
	fieldKey   = "idem_key_hash"
)
