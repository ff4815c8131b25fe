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
)

const (
	// heartbeatEvery is how often an idle dashboard stream gets a comment, so a gone client is
	// noticed (a live answer's heartbeat comes with its delivery's Idle events).
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
	// One key, one expiry: the claim's time plus the TTL, which the created answer, every
	// joined copy and every replay read from the record (a stream's headers go out before
	// the execution finishes, so no later instant is known to all of them).
	expires := adm.Claimed()
	if expires.IsZero() {
		expires = s.now()
	}
	c.Set("Idempotency-Expires", expires.Add(s.idem.TTL.D()).UTC().Format(http.TimeFormat))
	if adm.Outcome == intent.Replayed {
		c.Set("Idempotent-Replayed", "true")
	}
	if adm.Dedup != nil && wantsDedupReason(c) {
		c.Set(dedupReasonHeader, dedupReason(adm.Dedup))
	}
}

// awaited is how a copy's wait in the handler ended: ev is the output event a stream starts
// with, an event that ends the execution (a terminal chunk, or Finished: answer from its
// record); frames, usage and seen are a non-stream copy's output of the epoch, collected as
// it passed.
type awaited struct {
	ev            intent.Event
	frames, usage []byte
	seen          int
}

// await waits in the handler for what decides the status line: a stream's first output, or
// the end of the execution (a non-stream copy collects the frames as they pass, so it can
// assemble the answer itself when the execution ends, instead of every copy reading the
// record). The admission is closed unless ev is a stream's first output.
func (s *Server) await(c *fiber.Ctx, g *generation, adm *intent.Admission, stream bool) (awaited, error) {
	wait := maxGeneration
	if adm.Outcome == intent.Joined && !stream {
		wait = s.idem.MaxWait.D()
	}
	// The client's own deadline (Oncegate-Timeout) bounds the wait too: for a non-stream copy
	// the whole answer, for a stream its first chunk (a stream that started is never cut).
	if !g.Deadline.IsZero() {
		wait = min(wait, g.Deadline.Sub(s.now()))
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), wait)
	defer cancel()
	d := adm.Delivery()
	var aw awaited
	for {
		ev, err := d.Next(ctx)
		if err != nil {
			return aw, s.waitEnded(g, adm, err)
		}
		switch ev.Kind {
		case intent.Idle:
			continue
		case intent.Finished:
			adm.Close()
			aw.ev = ev
			return aw, nil
		}
		if g.obs.firstChunk.IsZero() {
			g.obs.firstChunk = time.Now()
		}
		output := ev.Kind == intent.Data || ev.Kind == intent.Usage
		if ev.Index() == 0 || !output {
			setMetaHeaders(c, ev.Meta())
		}
		if ev.Index() == 0 { // a new epoch after a takeover starts over
			aw.frames, aw.usage, aw.seen = nil, nil, 0
		}
		if stream && output {
			aw.ev = ev
			return aw, nil
		}
		if !output {
			adm.Close()
			aw.ev = ev
			return aw, nil
		}
		if ev.Kind == intent.Usage {
			aw.usage = ev.Payload()
		} else {
			aw.frames = append(aw.frames, ev.Payload()...)
		}
		aw.seen++
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
	if adm.Delivery() == nil {
		return s.replay(c, g, adm.View())
	}
	aw, err := s.await(c, g, adm, g.Stream)
	if err != nil {
		return err
	}
	switch ev := aw.ev; ev.Kind {
	case intent.Finished:
		return s.replay(c, g, ev.View)
	case intent.Data, intent.Usage: // the stream writer settles (and counts) when the stream ends
		streaming, g.live = true, true
		s.streamChat(c, g, adm, ev)
		return nil
	case intent.Result:
		if ev.Status() == http.StatusOK && g.Stream { // a stream copy of a non-stream execution (or a degraded message)
			return s.sendSynthesized(c, g, ev.Payload())
		}
		// The answer, or the backend's refusal: sending it again gets the same.
		return sendStored(c, ev.Status(), ev.Meta().ContentType, ev.Payload())
	case intent.Error:
		if ev.Status() != http.StatusOK { // failed after dispatch before output (released), or cancelled
			// The gateway decided: an SDK must not re-send on its own, except where nothing ran
			// (the backends refused, or none was available), which says when to come back.
			ra := ev.Meta().RetryAfter
			return forwardError(c, ev.Status(), ev.Payload(), retryIf(ra > 0), ra)
		}
	case intent.Done:
		if !g.Stream && ev.Index() > 0 && ev.Index() == aw.seen {
			body, err := wireOf(g.API).assemble(aw.frames, aw.usage)
			if err == nil {
				c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
				return c.Status(http.StatusOK).Send(body)
			}
		}
	}
	// Anything else is rendered from the stored record (a finished stream for a non-stream
	// copy whose frames were not all seen, an error after output…).
	v, err := adm.Reread(c.UserContext())
	if err != nil {
		return errRecordUnreadable
	}
	return s.replay(c, g, v)
}

// waitEnded closes the admission whose delivery failed before this copy's answer began, and
// says what the client gets: its own deadline passed, a joined copy's wait over (the key is in
// use), or err.
func (s *Server) waitEnded(g *generation, adm *intent.Admission, err error) error {
	adm.Close()
	switch {
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
func setMetaHeaders(c *fiber.Ctx, m intent.Meta) {
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

// answerHeaders says how a stored answer was obtained: every epoch's attempts, as the record
// counts them.
func answerHeaders(c *fiber.Ctx, v *intent.View) {
	if a := v.Answer; a != nil {
		setMetaHeaders(c, intent.Meta{Backend: a.Backend, Attempts: v.Attempts, Degraded: a.Degraded})
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

// streamChat writes a chat (or Anthropic) stream that follows the execution live from first,
// its first output.
func (s *Server) streamChat(c *fiber.Ctx, g *generation, adm *intent.Admission, first intent.Event) {
	r := &chatRender{w: wireOf(g.API), includeUsage: g.includeUsage, log: s.log, jobID: adm.JobID}
	obs := g.obs
	s.streamLive(c, &sseWriter{}, adm.Delivery(), r, &first, obs.start, func(ctx context.Context, se streamEnd) {
		s.countStream(ctx, &obs, adm, se)
		adm.Done()
	})
}

// replay answers from a stored record: the original status and body for non-stream (byte for
// byte), the stored frames then [DONE] for a stream.
func (s *Server) replay(c *fiber.Ctx, g *generation, v *intent.View) error {
	a := v.Answer
	if a == nil {
		return errNoResult
	}
	answerHeaders(c, v)
	w := wireOf(v.API)
	if !a.Failed && a.Status != http.StatusOK {
		return sendStored(c, a.Status, a.ContentType, a.Body)
	}
	if a.Failed && (!a.Partial || !g.Stream) {
		status := a.Status
		if status == http.StatusOK {
			status = http.StatusBadGateway
		}
		body := a.Body
		if len(body) == 0 {
			body = w.errorBody(errExecutionFailed)
		}
		return forwardError(c, status, body, retryNo, 0)
	}
	if !g.Stream {
		body := a.Body
		if v.Stream {
			var err error
			if body, err = w.assemble(a.Events, a.UsageEvent); err != nil {
				return err
			}
		}
		return sendStored(c, http.StatusOK, a.ContentType, body)
	}
	events, usage := a.Events, a.UsageEvent
	if !v.Stream {
		var err error
		if events, usage, err = w.synthesize(a.Body); err != nil {
			return err
		}
	}
	var failure []byte
	if a.Failed {
		failure = failureBody(w, a)
	}
	return sendStream(c, w, events, usage, g.includeUsage, failure)
}

// respondAccepted answers Prefer: respond-async with 202 and where to find the job.
func (s *Server) respondAccepted(c *fiber.Ctx, g *generation, adm *intent.Admission) error {
	adm.Close()
	adm.Done() // nobody follows an async job here: its cost counts through the budget's settle hold, then the ledger
	s.setGenerationHeaders(c, g, adm)
	c.Set(fiber.HeaderLocation, "/v1/jobs/"+adm.JobID)
	status := adm.View().Status()
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
