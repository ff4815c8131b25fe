package httpapi

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

const (
	// heartbeatEvery is how often an idle SSE stream gets a comment, so a gone client is noticed.
	heartbeatEvery = 5 * time.Second
	// maxGeneration bounds how long one request follows an execution.
	maxGeneration = 15 * time.Minute
	mimeSSE       = "text/event-stream"
)

// setGenerationHeaders writes the headers every generation response carries.
func (s *Server) setGenerationHeaders(c *fiber.Ctx, g *generation, adm *intent.Admission) {
	c.Set("Idempotency-Key", g.echoKey)
	c.Set("Oncegate-Idempotency", string(adm.Outcome))
	c.Set("Oncegate-Job-Id", adm.JobID)
	expires := s.now()
	if adm.Rec != nil && adm.Rec.Result != nil && !adm.Rec.Result.Finished.IsZero() {
		expires = adm.Rec.Result.Finished
	}
	c.Set("Idempotency-Expires", expires.Add(s.idem.TTL.D()).UTC().Format(http.TimeFormat))
	if adm.Outcome == intent.Replayed {
		c.Set("Idempotent-Replayed", "true")
	}
	if adm.Dedup != nil && wantsDedupReason(c) {
		c.Set(dedupReasonHeader, dedupReason(adm.Dedup))
	}
}

// deliver answers a generation request from its admission.
func (s *Server) deliver(c *fiber.Ctx, g *generation, adm *intent.Admission) error {
	streaming := false
	defer func() {
		if !streaming {
			adm.Done()
		}
	}()
	s.setGenerationHeaders(c, g, adm)
	if adm.Follower() == nil {
		return s.replay(c, g, adm.Rec)
	}
	// Wait for the first chunk in the handler: its kind decides the status line. A
	// non-stream copy waits for the terminal chunk.
	wait := maxGeneration
	if adm.Outcome == intent.Joined && !g.Stream {
		wait = s.idem.MaxWait.D()
	}
	// The client's own deadline (Oncegate-Timeout) bounds the wait too: for a non-stream copy
	// the whole answer, for a stream its first chunk (a stream that started is never cut).
	if !g.Deadline.IsZero() {
		wait = min(wait, g.Deadline.Sub(s.now()))
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), wait)
	defer cancel()
	var first jobs.Chunk
	// A non-stream copy of a streamed execution collects the frames as they pass, so it can
	// assemble the answer itself when the execution ends (the terminal chunk comes only after
	// the record is durable), instead of every copy reading the record.
	var frames, usage []byte
	seen := 0 // chunks of the current epoch collected
	for {
		ch, err := adm.Next(ctx)
		if err != nil {
			if err = s.waitEnded(g, adm, err); errors.Is(err, intent.ErrFinished) {
				return s.replay(c, g, adm.Rec)
			}
			return err
		}
		if g.obs.firstChunk.IsZero() {
			g.obs.firstChunk = time.Now()
		}
		if ch.Idx == 0 || ch.Terminal() {
			setMetaHeaders(c, ch.Meta)
		}
		if ch.Idx == 0 { // a new epoch after a takeover starts over
			frames, usage, seen = nil, nil, 0
		}
		if g.Stream && (ch.Kind == jobs.KindData || ch.Kind == jobs.KindUsage) {
			streaming, g.live = true, true // the stream writer settles (and counts) when the stream ends
			s.streamLive(c, g, adm, ch)
			return nil
		}
		if ch.Terminal() {
			first = ch
			break
		}
		switch ch.Kind {
		case jobs.KindData:
			frames = append(frames, ch.Payload...)
		case jobs.KindUsage:
			usage = ch.Payload
		}
		seen++
	}
	adm.Close()
	switch first.Kind {
	case jobs.KindResult:
		if first.Status == http.StatusOK && g.Stream { // a stream copy of a non-stream execution (or a degraded message)
			return s.sendSynthesized(c, g, first.Payload)
		}
		// The answer, or the backend's refusal: sending it again gets the same.
		return sendStored(c, first.Status, first.Meta.ContentType, first.Payload)
	case jobs.KindError:
		if first.Status != http.StatusOK { // failed after dispatch before output (released), or cancelled
			// The gateway decided: an SDK must not re-send on its own, except where nothing ran
			// (the backends refused, or none was available), which says when to come back.
			ra := first.Meta.RetryAfter
			return forwardError(c, first.Status, first.Payload, retryIf(ra > 0), ra)
		}
	}
	if first.Kind == jobs.KindDone && !g.Stream && first.Idx > 0 && first.Idx == seen {
		body, err := wireOf(g.API).assemble(frames, usage)
		if err == nil {
			c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
			return c.Status(http.StatusOK).Send(body)
		}
	}
	// Anything else is rendered from the stored record (a finished stream for a non-stream
	// copy whose frames were not all seen, an error after output…).
	rec, err := s.intents.Record(c.UserContext(), adm.Key)
	if err != nil {
		return errRecordUnreadable
	}
	return s.replay(c, g, rec)
}

// waitEnded closes the admission whose Next failed before this copy's answer began, and says
// what the client gets: intent.ErrFinished as it is (the caller answers from adm.Rec), its own
// deadline passed, a joined copy's wait over (the key is in use), or err.
func (s *Server) waitEnded(g *generation, adm *intent.Admission, err error) error {
	adm.Close()
	switch {
	case errors.Is(err, intent.ErrFinished):
		return err
	case errors.Is(err, context.DeadlineExceeded) && !g.Deadline.IsZero() && !s.now().Before(g.Deadline):
		return errDeadlinePassed
	case errors.Is(err, context.DeadlineExceeded) && adm.Outcome == intent.Joined:
		return errKeyInUse
	}
	return err
}

// The headers that say how an answer was obtained.
const (
	headerBackend  = "Oncegate-Backend"
	headerAttempts = "Oncegate-Attempts"
	// headerDegraded marks an answer given by the route's degraded path.
	headerDegraded = "Oncegate-Degraded"
)

// setMetaHeaders says how the answer was obtained.
func setMetaHeaders(c *fiber.Ctx, m jobs.Meta) {
	if m.Backend != "" {
		c.Set(headerBackend, m.Backend)
	}
	if m.Attempts > 0 {
		c.Set(headerAttempts, strconv.Itoa(m.Attempts))
	}
	if m.Degraded {
		c.Set(headerDegraded, "true")
	}
}

// sendSynthesized answers a stream request from a complete (non-stream) response body.
func (s *Server) sendSynthesized(c *fiber.Ctx, g *generation, body []byte) error {
	w := wireOf(g.API)
	events, usage, err := w.synthesize(body)
	if err != nil {
		return err
	}
	return sendStream(c, w, events, usage, g.includeUsage, nil)
}

// sendStream answers a stream request in one piece: the events as this client gets them,
// then the usage frame (if asked for) and the end — or, when failure is set, the error event.
func sendStream(c *fiber.Ctx, w wire, events, usage []byte, includeUsage bool, failure []byte) error {
	events = w.events(events, includeUsage)
	out := make([]byte, 0, len(events)+len(usage)+len(failure)+64)
	out = append(out, events...)
	if failure != nil {
		out = append(out, w.errorFrame(failure)...)
	} else {
		if includeUsage {
			out = append(out, usage...)
		}
		out = append(out, w.doneFrame()...)
	}
	return (&sseWriter{}).whole(c, out)
}

// streamLive writes an SSE stream that follows the execution live. It runs after the handler
// returned, so it captures only owned values. A stream whose terminal chunk never comes ends
// from the record (recordend.go).
func (s *Server) streamLive(c *fiber.Ctx, g *generation, adm *intent.Admission, first jobs.Chunk) {
	out := &sseWriter{}
	includeUsage, log, jobID, w := g.includeUsage, s.log, adm.JobID, wireOf(g.API)
	intents, key, epoch := s.intents, adm.Key, adm.Rec.Epoch
	obs := g.obs
	h := &c.Response().Header
	se := streamEnd{backend: string(h.Peek(headerBackend)), attempts: string(h.Peek(headerAttempts))}
	out.live(c, adm.Follower(), s.writeTimeout, func() {
		defer adm.Done()
		ctx, cancel := context.WithTimeout(context.Background(), maxGeneration)
		defer cancel()
		defer func() {
			se.bytes = out.written
			s.countStream(ctx, &obs, adm, se)
		}()
		var sent liveSent
		var idle func() error // a local execution has no record to check
		if !adm.Local() {
			idle = recordCheck(ctx, intents, key, epoch)
		}
		for ch := first; ; {
			var err error
			switch ch.Kind {
			case jobs.KindData:
				sent.data(ch.Payload)
				err = out.write(w.chunkEvents(ch, includeUsage))
				if se.firstWrite.IsZero() {
					se.firstWrite = time.Now()
					se.ttft = se.firstWrite.Sub(obs.start)
				}
			case jobs.KindUsage:
				sent.usage = true
				if includeUsage {
					err = out.write(ch.Payload)
				}
			case jobs.KindDone:
				_ = out.end(w.doneFrame())
				return
			case jobs.KindError:
				_ = out.end(w.errorFrame(ch.Payload))
				return
			default: // fence (or a stray result): the execution restarted after this client got output
				_ = out.end(w.errorFrame(w.restarted()))
				return
			}
			if err != nil {
				return // client gone; the execution goes on for its other copies
			}
			if ch, err = out.nextChunk(ctx, idle); err != nil {
				if errors.Is(err, errClientGone) {
					return
				}
				rec, ended := endedRecord(err)
				if !ended && !errors.Is(err, context.DeadlineExceeded) { // the feed ended: the record may say how
					rec, _ = intents.Record(ctx, key)
				}
				if rec != nil {
					if tail, ok := w.tail(rec, epoch, &sent, includeUsage); ok {
						log.Info().Str(fieldJobID, jobID).Str("state", string(rec.State)).Msg("stream follower ended from the record: its terminal chunk never came")
						_ = out.end(tail)
						return
					}
				}
				// Never a silent end: taken over after this client got output, or cut.
				log.Warn().Err(err).Str(fieldJobID, jobID).Msg("stream follower ended without a terminal chunk")
				frame := w.interrupted()
				if rec != nil && rec.Epoch != epoch {
					frame = w.restarted()
				}
				_ = out.end(w.errorFrame(frame))
				return
			}
		}
	})
}

// replay answers from a stored record: the original status and body for non-stream (byte for
// byte), the stored frames then [DONE] for a stream.
func (s *Server) replay(c *fiber.Ctx, g *generation, rec *kv.Record) error {
	res := rec.Result
	if res == nil {
		return errNoResult
	}
	setMetaHeaders(c, jobs.Meta{Backend: res.Backend, Attempts: rec.Attempts, Degraded: res.Degraded}) // every epoch's, as the record counts them
	w := wireOf(rec.API)
	if rec.State == kv.Completed && res.Status != http.StatusOK {
		return sendStored(c, res.Status, res.ContentType, res.Body)
	}
	if rec.State == kv.Failed && (!res.Partial || !g.Stream) {
		status := res.Status
		if status == http.StatusOK {
			status = http.StatusBadGateway
		}
		body := res.Body
		if len(body) == 0 {
			body = w.errorBody(errExecutionFailed)
		}
		return forwardError(c, status, body, retryNo, 0)
	}
	if !g.Stream {
		body := res.Body
		if rec.Stream {
			var err error
			if body, err = w.assemble(res.Events, res.UsageEvent); err != nil {
				return err
			}
		}
		return sendStored(c, http.StatusOK, res.ContentType, body)
	}
	events, usage := res.Events, res.UsageEvent
	if !rec.Stream {
		var err error
		if events, usage, err = w.synthesize(res.Body); err != nil {
			return err
		}
	}
	var failure []byte
	if rec.State == kv.Failed {
		failure = failureBody(w, res)
	}
	return sendStream(c, w, events, usage, g.includeUsage, failure)
}

// respondAccepted answers Prefer: respond-async with 202 and where to find the job.
func (s *Server) respondAccepted(c *fiber.Ctx, g *generation, adm *intent.Admission) error {
	adm.Close()
	adm.Done() // nobody follows an async job here: its cost counts through the budget's settle hold, then the ledger
	s.setGenerationHeaders(c, g, adm)
	c.Set(fiber.HeaderLocation, "/v1/jobs/"+adm.JobID)
	status := jobStatus(adm.Rec)
	return c.Status(http.StatusAccepted).JSON(fiber.Map{"id": adm.JobID, "object": "job", "status": status})
}

// sendStored answers with a non-stream outcome, stored or just announced: its status and body
// under its Content-Type (JSON when it has none: every API but a passthrough answers JSON). A
// status other than 200 is the backend's refusal, which a re-send would meet again.
func sendStored(c *fiber.Ctx, status int, contentType string, body []byte) error {
	if status != http.StatusOK {
		setRetryHeaders(c, retryNo, 0)
	}
	c.Set(fiber.HeaderContentType, cmp.Or(contentType, fiber.MIMEApplicationJSON))
	return c.Status(status).Send(body)
}
