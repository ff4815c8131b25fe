package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
	"github.com/oncegate/oncegate/internal/responseswire"
	"github.com/oncegate/oncegate/internal/telemetry"
)

// The OpenAI Responses API (POST /v1/responses, GET /v1/responses/{id}, POST
// /v1/responses/{id}/cancel) is one more front door to the same admission: the request
// becomes the chat completions request that runs it (responseswire), always streamed, with
// the Responses-only fields kept in the record (kv.Record.Echo); every answer, live, replayed,
// retrieved or resumed, is rendered from the record's chat frames by responseswire, which is
// a pure function of them. So every copy gets the same bytes, and a stream resumed on another
// node with starting_after continues with the very events it missed. A response's id is its
// job's (resp_<job id>); with store (the default) the job index is durable, so the id can be
// retrieved, resumed and continued (previous_response_id) for the record's TTL.

// Errors of the Responses API.
var (
	// errNoResponse: no response of this tenant has this id (unknown, expired, foreign, or
	// not a response: the same answer).
	errNoResponse = errors.New("httpapi: no such response")
	// errPreviousResponse: previous_response_id names no stored, finished response of the tenant.
	errPreviousResponse = errors.New("httpapi: previous response not found")
)

func (s *Server) routesResponses(r fiber.Router) {
	r.Post("/responses", s.createResponse)
	r.Get("/responses/:id", s.getResponse)
	r.Post("/responses/:id/cancel", s.cancelResponse)
}

// createResponse is POST /v1/responses.
func (s *Server) createResponse(c *fiber.Ctx) error {
	ctx, obs := s.startObservation(c, telemetry.RouteResponses, telemetry.APIOpenAI)
	g, stream, err := s.parseResponse(ctx, c)
	if err != nil {
		s.countError(&obs, nil, err)
		return err
	}
	g.observe(ctx, obs)
	g.obs.stream = stream
	adm, err := s.admit(ctx, g)
	if err != nil {
		s.countError(&g.obs, nil, err)
		return err
	}
	if g.Async && !stream {
		err = s.respondBackground(c, g, adm)
	} else {
		err = s.deliverResponse(c, g, adm, stream)
	}
	switch {
	case err != nil:
		s.countError(&g.obs, adm, err)
	case !g.live:
		s.countAnswer(c, &g.obs, adm)
	}
	return err
}

// parseResponse authenticates, validates and translates a Responses request; stream is the
// client's mode (the execution always streams). It changes no state.
func (s *Server) parseResponse(ctx context.Context, c *fiber.Ctx) (g *generation, stream bool, err error) {
	if ct := c.Get(fiber.HeaderContentType); !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), fiber.MIMEApplicationJSON) {
		return nil, false, errUnsupportedMediaType
	}
	tenant, err := s.authenticate(c)
	if err != nil {
		return nil, false, err
	}
	body, err := s.takeBody(c)
	if err != nil {
		return nil, false, err
	}
	fp, _, err := fingerprintOf(body, isResponsesTransportField)
	if err != nil {
		return nil, false, refusedBody(body, err, func(name string, _ []byte) error {
			if name != "max_output_tokens" {
				return nil
			}
			_, perr := responseswire.Parse(body) // refuses it as any max_output_tokens beyond int64
			if perr == nil {
				return nil
			}
			return responsesInvalid(perr)
		})
	}
	rr, err := responseswire.Parse(body)
	if err != nil {
		return nil, false, responsesInvalid(err)
	}
	rt, ok := s.router.Resolve(rr.Model)
	api := s.responsesAPI(rt.Backends)
	backends := s.compatible(rt.Backends, api)
	if !ok || len(backends) == 0 {
		return nil, false, modelNotFound(rr.Model)
	}
	var history []json.RawMessage
	var upstreamPrevious string
	if rr.PreviousResponseID != "" {
		if history, upstreamPrevious, err = s.previousConversation(ctx, tenant, rr.PreviousResponseID, api); err != nil {
			return nil, false, err
		}
	}
	var backendBody []byte
	switch api {
	case apiAnthropic:
		backendBody, err = rr.Anthropic(history, anthropicMaxTokens)
	case apiResponses:
		backendBody, err = responseswire.Native(body, upstreamPrevious)
	default:
		backendBody, err = rr.Chat(history)
	}
	if err != nil {
		return nil, false, responsesInvalid(err)
	}
	echo, err := rr.Echo(history)
	if err != nil {
		return nil, false, responsesInvalid(err)
	}
	g = &generation{Request: intent.Request{Tenant: tenant, Body: backendBody, Fingerprint: fp, Model: rr.Model,
		Backends: backends, API: api, Stream: true, MaxTokens: rr.MaxOutputTokens, Echo: echo,
		Retrievable: rr.Store}}
	if err := s.readIntent(c, g, rt); err != nil {
		return nil, false, err
	}
	if rr.Background {
		g.setAsync()
	}
	return g, rr.Stream, nil
}

// anthropicMaxTokens is the max_tokens an Anthropic backend gets for a Responses request that
// sets no max_output_tokens (the Messages API requires one; the Responses API has no limit).
const anthropicMaxTokens = 4096

// responsesAPI is the wire format a route's Responses requests run in, chosen by its first
// backend: the Responses API itself on a native one, Anthropic Messages on one that speaks
// only that, else Chat Completions (the mock and another oncegate speak both). The chain
// keeps the backends that speak it.
func (s *Server) responsesAPI(names []string) string {
	if len(names) > 0 {
		if b, ok := s.router.Backend(names[0]); ok {
			switch {
			case b.Responses == config.ResponsesNative:
				return apiResponses
			case b.Type == config.TypeAnthropic:
				return apiAnthropic
			}
		}
	}
	return apiOpenAI
}

// responsesInvalid is the 400 of a request responseswire refuses.
func responsesInvalid(err error) error {
	var e *responseswire.Error
	if errors.As(err, &e) {
		return badRequest(e.Code, e.Param, e.Message).ptr()
	}
	return invalidJSON(err)
}

// previousConversation is the conversation a request continues: the stored response's
// messages and its output, or, on a native backend (api), the backend's own id of it (the
// backend keeps the conversation). It must be the tenant's, stored, and completed, and a
// native continuation must continue a native response.
func (s *Server) previousConversation(ctx context.Context, tenant, id, api string) (history []json.RawMessage, upstream string, err error) {
	job := responseswire.JobOf(id)
	if !intent.ParseJobID(job) {
		return nil, "", errPreviousResponse
	}
	rec, err := s.intents.JobView(ctx, tenant, job)
	if errors.Is(err, intent.ErrNoJob) {
		return nil, "", errPreviousResponse
	}
	if err != nil {
		return nil, "", err
	}
	meta, echo, ok := responseMeta(rec)
	if !ok || rec.State != intent.Completed || (rec.API == apiResponses) != (api == apiResponses) {
		return nil, "", errPreviousResponse
	}
	if api == apiResponses {
		if upstream = responseswire.UpstreamID(rec.Answer.Events); upstream == "" {
			return nil, "", errPreviousResponse
		}
		return nil, upstream, nil
	}
	r, err := renderRecord(rec, meta)
	if echo.Messages == nil || err != nil || r.status != responseswire.StatusCompleted && r.status != responseswire.StatusIncomplete {
		return nil, "", errPreviousResponse
	}
	return r.stream.Conversation(echo), "", nil
}

// responseMeta is what a Responses record renders with; ok is false for a record of another API.
func responseMeta(rec *intent.View) (responseswire.Meta, *responseswire.Echo, bool) {
	if len(rec.Echo) == 0 {
		return responseswire.Meta{}, nil, false
	}
	echo, err := responseswire.ParseEcho(rec.Echo)
	if err != nil {
		return responseswire.Meta{}, nil, false
	}
	return responseswire.Meta{ID: responseswire.IDOf(rec.ID), CreatedAt: rec.Created.Unix(), Model: rec.Model, Params: echo.Params,
		Native: rec.API == apiResponses}, echo, true
}

// rendered is a finished record as the Responses API shows it.
type rendered struct {
	stream *responseswire.Stream
	events []byte // every event after the stream's After
	status string
	object []byte
	// backendStatus is the HTTP status of a backend's refusal stored as the outcome (a 4xx a
	// retry would meet again), with body its error: a POST answers with it as chat does.
	backendStatus int
	body          []byte
}

// renderRecord renders a finished record from its first event, skipping events up to after.
func renderRecord(rec *intent.View, meta responseswire.Meta, after ...int) (*rendered, error) {
	res := rec.Answer
	if res == nil || rec.Running() {
		return nil, errNoResult
	}
	st := responseswire.NewStream(meta)
	if len(after) > 0 {
		st.After = after[0]
	}
	r := &rendered{stream: st}
	r.events = append(r.events, st.Start()...)
	switch {
	case res.OK():
		frames, usage := res.Events, res.UsageEvent
		if !rec.Stream {
			var err error
			if frames, usage, err = wireOf(rec.API).synthesize(res.Body); err != nil {
				return nil, err
			}
		}
		ev, err := st.Frames(append(append([]byte{}, frames...), usage...))
		if err != nil {
			return nil, err
		}
		r.events = append(append(r.events, ev...), st.Complete()...)
		r.object = st.Response(responseswire.StatusCompleted)
		r.status = statusOf(r.object)
		return r, nil
	case !res.Failed:
		r.backendStatus, r.body = res.Status, res.Body
	case res.Partial:
		ev, err := st.Frames(append(append([]byte{}, res.Events...), res.UsageEvent...))
		if err != nil {
			return nil, err
		}
		r.events = append(r.events, ev...)
	}
	r.status = responseswire.StatusFailed
	if rec.Cancelled {
		r.status = responseswire.StatusCancelled
	}
	code, msg := errorFields(res.Body, errExecutionFailed)
	r.events = append(r.events, st.Fail(r.status, code, msg)...)
	r.object = st.FailedResponse(r.status, code, msg)
	return r, nil
}

// statusOf reads the status of a response object rendered here.
func statusOf(obj []byte) string {
	var v struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(obj, &v)
	return v.Status
}

// errorFields are the code and message of an OpenAI error body (dflt's when it has none).
func errorFields(body []byte, dflt error) (code, message string) {
	var e struct {
		Error struct {
			Code    any    `json:"code"`
			Type    string `json:"type"` // an Anthropic error's only code
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		if s, ok := e.Error.Code.(string); ok {
			code = s
		}
		return cmp.Or(code, e.Error.Type, "server_error"), e.Error.Message
	}
	ae := answer(dflt)
	return ae.Code, ae.Message
}

// responsesError is a backend's error body as a Responses client reads it: OpenAI's format,
// converted from an Anthropic backend's.
func responsesError(api string, body []byte) []byte {
	if api != apiAnthropic {
		return body
	}
	code, msg := errorFields(body, errExecutionFailed)
	return openaiwire.ErrorBody(msg, code, code, "")
}

// respondBackground answers background: true at once with the response as it stands (queued).
func (s *Server) respondBackground(c *fiber.Ctx, g *generation, adm *intent.Admission) error {
	adm.Close()
	adm.Done() // nobody follows a background response here (as for a job answered 202)
	s.setGenerationHeaders(c, g, adm)
	return s.sendResponseObject(c, adm.View())
}

// sendResponseObject answers with the response object of rec as it stands.
func (s *Server) sendResponseObject(c *fiber.Ctx, rec *intent.View) error {
	meta, _, ok := responseMeta(rec)
	if !ok {
		return errNoResponse
	}
	var obj []byte
	if rec.Running() {
		status := responseswire.StatusInProgress
		if rec.Status() == intent.JobQueued {
			status = responseswire.StatusQueued
		}
		obj = responseswire.NewStream(meta).Response(status)
	} else {
		r, err := renderRecord(rec, meta)
		if err != nil {
			return err
		}
		obj = r.object
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(http.StatusOK).Send(obj)
}

// deliverResponse answers a POST /v1/responses from its admission.
func (s *Server) deliverResponse(c *fiber.Ctx, g *generation, adm *intent.Admission, stream bool) error {
	streaming := false
	defer func() {
		if !streaming {
			adm.Done()
		}
	}()
	s.setGenerationHeaders(c, g, adm)
	v := adm.View()
	meta, _, ok := responseMeta(v)
	if !ok { // a record of another API under this key (an Idempotency-Key used on chat)
		adm.Close()
		return intent.ErrKeyReused
	}
	if adm.Delivery() == nil {
		return s.replayResponse(c, v, meta, stream)
	}
	aw, err := s.await(c, g, adm, stream)
	if err != nil {
		return err
	}
	api := v.API
	switch ev := aw.ev; ev.Kind {
	case intent.Finished:
		return s.replayResponse(c, ev.View, meta, stream)
	case intent.Data, intent.Usage:
		streaming, g.live = true, true
		obs := g.obs
		r := s.responsesRender(adm.Delivery(), api, responseswire.NewStream(meta))
		s.streamLive(c, &sseWriter{}, adm.Delivery(), r, &ev, obs.start, func(ctx context.Context, se streamEnd) {
			s.countStream(ctx, &obs, adm, se)
			adm.Done()
		})
		return nil
	case intent.Result:
		if ev.Status() != http.StatusOK {
			return forwardError(c, ev.Status(), responsesError(api, ev.Payload()), retryNo, 0)
		}
	case intent.Error:
		if ev.Status() != http.StatusOK {
			ra := ev.Meta().RetryAfter
			return forwardError(c, ev.Status(), responsesError(api, ev.Payload()), retryIf(ra > 0), ra)
		}
	case intent.Done:
		if ev.Index() == aw.seen {
			st := responseswire.NewStream(meta)
			events := st.Start()
			ev, err := st.Frames(append(aw.frames, aw.usage...))
			if err == nil {
				events = append(append(events, ev...), st.Complete()...)
				return sendRendered(c, stream, events, st.Response(responseswire.StatusCompleted))
			}
		}
	}
	rec, err := adm.Reread(c.UserContext())
	if err != nil {
		return errRecordUnreadable
	}
	return s.replayResponse(c, rec, meta, stream)
}

// replayResponse answers from a finished record.
func (s *Server) replayResponse(c *fiber.Ctx, rec *intent.View, meta responseswire.Meta, stream bool) error {
	answerHeaders(c, rec)
	r, err := renderRecord(rec, meta)
	if err != nil {
		return err
	}
	if r.backendStatus != 0 { // the backend's refusal, as the live copy got it
		return forwardError(c, r.backendStatus, responsesError(rec.API, r.body), retryNo, 0)
	}
	if r.status == responseswire.StatusFailed && !stream {
		res := rec.Answer
		status := res.Status
		if status == http.StatusOK {
			status = http.StatusBadGateway
		}
		body := responsesError(rec.API, res.Body)
		if len(body) == 0 {
			body = wireOf(apiOpenAI).errorBody(errExecutionFailed)
		}
		return forwardError(c, status, body, retryNo, 0)
	}
	return sendRendered(c, stream, r.events, r.object)
}

// sendRendered answers in one piece: the events for a stream, the object otherwise.
func sendRendered(c *fiber.Ctx, stream bool, events, object []byte) error {
	if stream {
		return (&sseWriter{}).whole(c, events)
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(http.StatusOK).Send(object)
}

// responsesRenderer writes a live Responses stream: the chat frames rendered by st, ended by
// response.completed, or by response.failed when the execution failed or cannot be continued
// on this connection.
type responsesRenderer struct {
	d   *intent.Delivery
	w   wire
	st  *responseswire.Stream
	log zerolog.Logger
}

func (s *Server) responsesRender(d *intent.Delivery, api string, st *responseswire.Stream) *responsesRenderer {
	return &responsesRenderer{d: d, w: wireOf(api), st: st, log: s.log}
}

func (r *responsesRenderer) start() []byte { return r.st.Start() }

func (r *responsesRenderer) output(ev intent.Event) []byte {
	b, err := r.st.Frames(ev.Payload())
	if err != nil {
		r.log.Warn().Err(err).Msg("responses stream: a chat frame could not be rendered")
	}
	return b
}

// fail is response.failed (or cancelled) with cause's code and message.
func (r *responsesRenderer) fail(status string, cause error) []byte {
	ae := answer(cause)
	return r.st.Fail(status, ae.Code, ae.Message)
}

func (r *responsesRenderer) end(ctx context.Context, ev intent.Event) []byte {
	st := r.st
	switch ev.Kind {
	case intent.Done:
		return st.Complete()
	case intent.Result:
		if ev.Status() == http.StatusOK {
			if frames, usage, err := r.w.synthesize(ev.Payload()); err == nil {
				out, _ := st.Frames(append(append([]byte{}, frames...), usage...))
				return append(out, st.Complete()...)
			}
		}
		code, msg := errorFields(ev.Payload(), errExecutionFailed)
		return st.Fail(responseswire.StatusFailed, code, msg)
	case intent.Error:
		code, msg := errorFields(ev.Payload(), errExecutionFailed)
		status := responseswire.StatusFailed
		if v, err := r.d.Reread(ctx); err == nil && v.Cancelled {
			status = responseswire.StatusCancelled
		}
		return st.Fail(status, code, msg)
	case intent.Finished:
		if ev.Continues {
			v, res := ev.View, ev.View.Answer
			r.log.Info().Str(fieldJobID, v.ID).Str("state", string(v.State)).Msg("responses stream ended from the record: its terminal chunk never came")
			rest := ev.Rest
			if !ev.UsageSent {
				rest = append(append([]byte{}, rest...), res.UsageEvent...)
			}
			out, _ := st.Frames(rest)
			if res.OK() {
				return append(out, st.Complete()...)
			}
			code, msg := errorFields(res.Body, errExecutionFailed)
			status := responseswire.StatusFailed
			if v.Cancelled {
				status = responseswire.StatusCancelled
			}
			return append(out, st.Fail(status, code, msg)...)
		}
		r.log.Warn().Msg("responses stream ended without a terminal chunk")
		if ev.SameEpoch {
			return r.fail(responseswire.StatusFailed, errStreamCut)
		}
	}
	// A fence: the execution restarted after this client got output.
	return r.fail(responseswire.StatusFailed, errRestarted)
}

func (r *responsesRenderer) failed(err error) ([]byte, bool) {
	r.log.Warn().Err(err).Msg("responses stream ended without a terminal chunk")
	return r.fail(responseswire.StatusFailed, errStreamCut), true
}

// loadResponse finds a response of the caller's tenant by its id.
func (s *Server) loadResponse(c *fiber.Ctx) (*intent.View, responseswire.Meta, error) {
	tenant, err := s.authenticate(c)
	if err != nil {
		return nil, responseswire.Meta{}, err
	}
	job := responseswire.JobOf(c.Params("id"))
	if !intent.ParseJobID(job) {
		return nil, responseswire.Meta{}, errNoResponse
	}
	rec, err := s.intents.JobView(c.UserContext(), tenant, job)
	if errors.Is(err, intent.ErrNoJob) {
		return nil, responseswire.Meta{}, errNoResponse
	}
	if err != nil {
		return nil, responseswire.Meta{}, err
	}
	meta, _, ok := responseMeta(rec)
	if !ok {
		return nil, responseswire.Meta{}, errNoResponse
	}
	return rec, meta, nil
}

// getResponse is GET /v1/responses/{id}: the response object, or with stream=true its events
// from the start, or right after starting_after, live while it runs.
func (s *Server) getResponse(c *fiber.Ctx) error {
	rec, meta, err := s.loadResponse(c)
	if err != nil {
		return err
	}
	if !wantsStream(c) {
		// Running from its backend call on, as its worker's progress says (the record says so
		// only from its first lease renewal).
		return s.sendResponseObject(c, s.intents.Progressed(c.UserContext(), rec))
	}
	after := -1
	if v := c.Query("starting_after"); v != "" {
		if after, err = strconv.Atoi(v); err != nil || after < -1 {
			return errBadStartingAfter
		}
	}
	if !rec.Running() {
		r, err := renderRecord(rec, meta, after)
		if err != nil {
			return err
		}
		return (&sseWriter{}).whole(c, r.events)
	}
	d, release, err := s.intents.FollowJob(c.UserContext(), rec)
	if err != nil {
		return err
	}
	st := responseswire.NewStream(meta)
	st.After = after
	s.streamLive(c, &sseWriter{}, d, s.responsesRender(d, rec.API, st), nil, time.Time{}, func(context.Context, streamEnd) { release() })
	return nil
}

// wantsStream: GET /v1/responses/{id} asked for the event stream, in the query (stream=true)
// or, as the official SDKs send it, in a JSON body.
func wantsStream(c *fiber.Ctx) bool {
	if v := c.Query("stream"); v != "" {
		return strings.EqualFold(v, "true")
	}
	var b struct {
		Stream bool `json:"stream"`
	}
	return len(c.Body()) > 0 && json.Unmarshal(c.Body(), &b) == nil && b.Stream
}

// cancelResponse is POST /v1/responses/{id}/cancel: a running response is cancelled (as DELETE
// /v1/jobs/{id} cancels a job); a finished one is answered as it is.
func (s *Server) cancelResponse(c *fiber.Ctx) error {
	rec, _, err := s.loadResponse(c)
	if err != nil {
		return err
	}
	tenant, _ := s.authenticate(c)
	if rec, err = s.intents.CancelJob(c.UserContext(), tenant, rec.ID, cancelledBody); err != nil {
		return err
	}
	return s.sendResponseObject(c, rec)
}
