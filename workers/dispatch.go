package workers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/clock"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/resilience"
)

// Backend is what a worker needs from a provider adapter: one attempt at a time. The retry
// policy, budget and breaker are the worker's.
type Backend interface {
	Name() string
	// Config is the backend's configuration with defaults filled in.
	Config() config.Backend
	// Send makes one attempt; errors wrap backend.ErrNotSent, ErrResendSafe or ErrAmbiguous.
	Send(ctx context.Context, call *backend.Call) (*http.Response, context.CancelFunc, error)
}

// guard is a backend's retry budget and circuit breaker, shared by every job of a pool.
type guard struct {
	budget  *resilience.Budget
	breaker *resilience.Breaker
}

// retryAfterStatus: the backend refused before doing the work; retried with backoff.
func retryAfterStatus(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusBadGateway ||
		code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

// finalStatus: the request itself is refused; never retried, stored and replayed.
func finalStatus(code int) bool {
	return code >= 400 && code < 500 && code != http.StatusTooManyRequests && code != http.StatusRequestTimeout
}

// answer is a backend response to relay (status 200, or a final 4xx to store).
type answer struct {
	resp    *http.Response
	cancel  context.CancelFunc
	backend Backend
	// dialect is the API the backend was spoken to in (nil for embeddings and passthrough).
	dialect dialect.Dialect
	// report tells the breaker how the call went once its body was consumed.
	report func(ok bool)
}

// failure ends a job that got no answer to relay.
type failure struct {
	status     int
	body       []byte
	retryAfter int
	// degraded: the route's degraded answer (a message with status 200, or a 503).
	degraded bool
	// refused: the backends provably did not run the request (never written, or refused with
	// 429/502/503/504): the key is released and a later retry is safe (retryAfter > 0).
	refused bool
	// ambiguous: a written attempt ended without an answer; it may have run. The outcome is
	// kept (the key is not released), so no copy of the intent ever runs it again.
	ambiguous bool
}

// dispatch walks the route's backends in order: an open breaker or an exhausted backend
// falls back to the next. Per backend it retries only what provably did not run (never
// written, or refused with 429/502/503/504 before any output, or safe to re-send), with
// exponential backoff and full jitter, Retry-After honored, within the budget and the
// deadline. A written request that ended without an answer is never re-sent, nor sent to
// another backend.
func (ex *execution) dispatch(ctx context.Context, body []byte) (*answer, *failure) {
	ans, fail, done := ex.tryBackends(ctx, body, ex.job.Backends)
	if done {
		return ans, fail
	}
	return nil, ex.degrade(fail)
}

// tryBackends is dispatch over names without the route's degraded answer: done=false means
// every backend was refused, exhausted or open (fail is the last refusal, nil when none was
// tried). Attempts already made on a backend by this execution (ex.tried) count against its
// max_attempts, so a stream re-sent after it broke before its first token stays within them.
func (ex *execution) tryBackends(ctx context.Context, body []byte, names []string) (ans *answer, fail *failure, done bool) {
	var last *failure
	for _, name := range names {
		b, ok := ex.pool.opts.Backends[name]
		if !ok {
			ex.log.Warn().Str("backend", name).Msg("backend not configured on this worker; skipping")
			continue
		}
		g := ex.pool.guard(name)
		cfg := b.Config()
		d, call, err := ex.prepare(b, body)
		if err != nil {
			// This backend cannot take this request (another API, or a feature it lacks):
			// nothing was sent; the next backend may.
			ex.log.Warn().Err(err).Str("backend", name).Msg("backend cannot take this request; skipping")
			last = &failure{status: http.StatusBadRequest, body: ex.errorBody(http.StatusBadRequest, "unsupported_by_backend", err.Error())}
			continue
		}
		for attempt := ex.tried[name]; attempt < cfg.MaxAttempts; attempt++ {
			if ex.pastDeadline(0) {
				return nil, ex.deadlineFailure(last), true
			}
			if attempt == 0 {
				g.budget.Request()
			} else if !g.budget.AllowRetry() {
				ex.pool.opts.Metrics.RetryBudgetRefused(name)
				ex.log.Warn().Str("backend", name).Msg("retry refused by the retry budget")
				break
			}
			report, err := g.breaker.Allow(ctx)
			if err != nil {
				ex.log.Info().Str("backend", name).Msg("circuit breaker open; falling back")
				break
			}
			ex.attempts++
			ex.noteTried(name, attempt+1)
			ex.noteSent(name, ex.attempts)
			// The client's deadline (ex.job.Deadline) does not bound an attempt: it is the client's,
			// not the intent's, so an attempt runs to the backend's own timeout and its outcome is
			// the one stored (see deadline.go).
			resp, cancel, err := b.Send(ctx, call)
			ex.pool.countAttempt(name, resp, err, attempt > 0)
			if err != nil {
				report(false)
				if ctx.Err() != nil {
					return nil, &failure{status: http.StatusServiceUnavailable}, true
				}
				switch {
				case errors.Is(err, backend.ErrNotSent), errors.Is(err, backend.ErrResendSafe):
					ex.log.Warn().Err(err).Str("backend", name).Int("attempt", attempt+1).Msg("attempt did not reach the backend; retrying")
					last = &failure{status: http.StatusBadGateway, refused: true,
						body: ex.errorBody(http.StatusBadGateway, "backend_unreachable", "the model backend could not be reached")}
					if !clock.Sleep(ctx, resilience.Backoff(attempt, cfg.RetryBase.D(), cfg.RetryCap.D())) {
						return nil, last, true
					}
					continue
				default: // written, no answer: it may have run; never re-sent
					ex.ambiguous++
					ex.log.Warn().Err(err).Str("backend", name).Msg("attempt ended without an answer after the request was written; not re-sent")
					return nil, &failure{status: http.StatusGatewayTimeout, ambiguous: true, body: ex.errorBody(http.StatusGatewayTimeout, "backend_timeout",
						"the model backend did not answer in time; the request may have been processed, so it is not sent again")}, true
				}
			}
			if resp.StatusCode == http.StatusOK || finalStatus(resp.StatusCode) || ex.passthroughSuccess(resp.StatusCode) {
				return &answer{resp: resp, cancel: cancel, backend: b, dialect: d, report: report}, nil, true
			}
			// 429, 5xx: refused (or failed) before any output.
			errBody, _ := io.ReadAll(io.LimitReader(resp.Body, maxBackendBody))
			if d != nil {
				errBody = d.ErrorBody(resp.StatusCode, errBody)
			}
			resp.Body.Close()
			cancel()
			report(false)
			last = &failure{status: resp.StatusCode, body: errBody, refused: retryAfterStatus(resp.StatusCode)}
			if !last.refused {
				return nil, last, true // a 500 may have done work: not retried, not sent elsewhere
			}
			delay := resilience.Backoff(attempt, cfg.RetryBase.D(), cfg.RetryCap.D())
			if ra, ok := resilience.RetryAfter(resp.Header, time.Now()); ok {
				last.retryAfter = int((ra + time.Second - 1) / time.Second)
				if ra > delay {
					delay = ra
				}
			}
			if attempt+1 >= cfg.MaxAttempts {
				break
			}
			if dl, ok := ctx.Deadline(); (ok && time.Now().Add(delay).After(dl)) || ex.pastDeadline(delay) {
				break
			}
			ex.log.Info().Str("backend", name).Int("status", resp.StatusCode).Dur("delay", delay).Msg("backend refused; retrying after backoff")
			if !clock.Sleep(ctx, delay) {
				return nil, last, true
			}
		}
	}
	return nil, last, false
}

// degrade is the route's answer when no backend answered: its configured message (200,
// marked degraded), else a 503 with Retry-After, else the last backend refusal.
func (ex *execution) degrade(last *failure) *failure {
	if ex.job.DegradedMessage != "" {
		return &failure{status: http.StatusOK, degraded: true, body: ex.client().Degraded(ex.job.ID, ex.job.Model, ex.job.DegradedMessage)}
	}
	if ex.job.DegradedRetryAfter > 0 || last == nil {
		ra := ex.job.DegradedRetryAfter
		if ra == 0 {
			ra = 1
		}
		return &failure{status: http.StatusServiceUnavailable, degraded: true, retryAfter: ra,
			body: ex.errorBody(http.StatusServiceUnavailable, "backends_unavailable", "no model backend is available for this model right now; retry later")}
	}
	if len(last.body) == 0 {
		last.body = ex.errorBody(last.status, "backend_error", fmt.Sprintf("the model backend failed with status %d", last.status))
	}
	if last.refused && last.retryAfter == 0 {
		last.retryAfter = 1 // nothing ran: say when to come back (the backend's own hint when it gave one)
	}
	return last
}

// api is the job's wire format.
func (ex *execution) api() string {
	switch ex.job.API {
	case backend.APIAnthropic, backend.APIResponses, backend.APIEmbeddings, backend.APIPassthrough:
		return ex.job.API
	}
	return backend.APIOpenAI
}

// client is the dialect of the job's API, for what the client is told without a backend.
func (ex *execution) client() dialect.Dialect { return ex.pool.dialects.Client(ex.api()) }

// errorBody is a gateway error in the job's API format.
func (ex *execution) errorBody(status int, code, msg string) []byte {
	return ex.client().GatewayError(status, code, msg)
}

// prepare is the call of the job's request to backend b, and the dialect it is in (nil for
// embeddings and passthrough, which go as they are).
func (ex *execution) prepare(b Backend, body []byte) (dialect.Dialect, *backend.Call, error) {
	switch api := ex.api(); api {
	case backend.APIEmbeddings, backend.APIPassthrough:
		return nil, &backend.Call{API: api, Path: ex.job.Path, Body: body, Stream: ex.job.Stream, IdemKey: ex.forwardKey(), Header: ex.job.Header,
			Model: ex.job.Model}, nil
	}
	d, err := ex.pool.dialects.For(b.Config().Type, ex.api())
	if err != nil {
		return nil, nil, err
	}
	call, err := ex.call(d, b, body, ex.job.Stream, ex.forwardKey())
	return d, call, err
}

// call is body as dialect d sends it to backend b.
func (ex *execution) call(d dialect.Dialect, b Backend, body []byte, stream bool, idemKey string) (*backend.Call, error) {
	up, err := d.Prepare(dialect.Request{API: ex.api(), Model: ex.job.Model, Body: body, Stream: stream, Header: ex.job.Header}, b.Config())
	if err != nil {
		return nil, err
	}
	return &backend.Call{API: ex.api(), Path: up.Path, Body: up.Body, Stream: stream, IdemKey: idemKey, Header: up.Header, KeyHeader: up.KeyHeader,
		Model: ex.job.Model}, nil
}

// forwardKey is the Idempotency-Key sent upstream: stable per intent, never client text.
func (ex *execution) forwardKey() string { return "oncegate-" + ex.job.Key }
