// Package jsretry classifies JetStream failures and retries the ones a leader election or a
// reconnect explains (a timeout, no responders, "cluster not available", "not leader"), for a
// bounded window. An R3 group has no leader for 4-9 s after its leader crashes; a graceful
// stop hands over in under a second.
//
// It retries a request, never invents one: the caller's try must send the same Nats-Msg-Id or
// the same expected revision each time, so a try that was applied although its answer was lost
// cannot be applied twice. Do is safe for concurrent use (it keeps no state).
package jsretry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrUnavailable is returned (wrapping the last failure) when JetStream kept failing with
// transient errors until the window or the caller's context ended. kv.ErrUnavailable and
// jobs.ErrUnavailable are this error; the HTTP API answers it 503 with Retry-After.
var ErrUnavailable = errors.New("jetstream unavailable")

const (
	// Window is how long a request is retried by default: longer than the 4-9 s an R3 election
	// takes after a crash (notes/nats-jetstream-measured.md §7).
	Window = 10 * time.Second
	// PerTry bounds one try, so a lost answer does not use up the window.
	PerTry = 2 * time.Second
	// backoff between tries: exponential from backoffBase to backoffCap, with full jitter.
	backoffBase = 50 * time.Millisecond
	backoffCap  = time.Second
)

// Transient reports whether err is a JetStream failure a retry of the same request may cure:
// no answer in time, nobody to answer (no leader, a reconnect), or the server saying so (503,
// 10008 cluster not available, 10009 not leader, 10163 last sequence not ready, 10158 the
// same message id still in process: a retry after a lost answer came before its first try
// was applied; 10167 too many requests: the stream's ingest queue was full, 128 MiB by
// default, which 48 concurrent 4 MiB requests filled, and the message was dropped unapplied).
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var again *againError
	if errors.As(err, &again) || Ambiguous(err) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrReconnectBufExceeded) ||
		errors.Is(err, nats.ErrDisconnected) {
		return true
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case ErrCodeClusterNotAvailable, jsErrClusterNotLeader, jsErrLastSeqNotReady, jsErrClusterIncomplete,
		jsErrDuplicateInProcess,    // an earlier try with this Nats-Msg-Id is still being applied
		jsErrStreamTooManyRequests: // back-pressure: the backoff lets the stream catch up
		return true
	case jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount,
		jsErrStoreFailed, jsErrInsufficientResources:
		return false // a 503 that stays until an operator acts (a full stream, no JetStream)
	}
	return apiErr.Code == 503
}

// ErrCodeClusterNotAvailable is JetStream's "system temporarily unavailable" (10008): on a
// cluster every server answers it to the stream API (info, message get, create) while the meta
// group has no leader, even for a stream whose own group has one.
const ErrCodeClusterNotAvailable jetstream.ErrorCode = 10008

// ClusterNotAvailable says err is ErrCodeClusterNotAvailable.
func ClusterNotAvailable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == ErrCodeClusterNotAvailable
}

// JetStream error codes not named by nats.go (nats-server errors.json).
const (
	jsErrClusterIncomplete     jetstream.ErrorCode = 10004
	jsErrClusterNotLeader      jetstream.ErrorCode = 10009
	jsErrInsufficientResources jetstream.ErrorCode = 10023
	jsErrStoreFailed           jetstream.ErrorCode = 10077
	jsErrLastSeqNotReady       jetstream.ErrorCode = 10163
	jsErrDuplicateInProcess    jetstream.ErrorCode = 10158 // a 409
	jsErrStreamTooManyRequests jetstream.ErrorCode = 10167 // a 429
)

// Ambiguous reports whether a failed request may still have been applied: its answer did not
// come in time (the server may have stored it, and a new leader may commit it). A refusal (no
// responders, a 503) was not applied.
func Ambiguous(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// Again marks err as transient for Do: the try could not decide yet (it read a replica that
// is behind its leader) and a later try may.
func Again(err error) error { return &againError{err} }

type againError struct{ err error }

func (e *againError) Error() string { return e.err.Error() }
func (e *againError) Unwrap() error { return e.err }

// Do calls try until it returns nil or an error that is not Transient, or until no time is
// left before until (or ctx's deadline, if earlier). Each try gets a context of its own,
// ending at most PerTry later. A try that must end the retries early (a CAS conflict) returns
// a non-transient error. Do returns nil, try's non-transient error as it is, or the last
// transient one wrapped in ErrUnavailable.
func Do(ctx context.Context, until time.Time, try func(ctx context.Context) error) error {
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	wait := backoffBase
	for {
		end := time.Now().Add(PerTry)
		if until.Before(end) {
			end = until
		}
		tctx, cancel := context.WithDeadline(ctx, end)
		err := try(tctx)
		cancel()
		if err == nil || !Transient(err) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		pause := rand.N(wait) + time.Millisecond // #nosec G404 -- retry jitter, not a secret
		wait = min(2*wait, backoffCap)
		if time.Until(until) < pause+10*time.Millisecond {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		case <-t.C:
		}
	}
}

// Within is Do with the default Window from now.
func Within(ctx context.Context, try func(ctx context.Context) error) error {
	return Do(ctx, time.Now().Add(Window), try)
}
