// Package effects is a small Go client of oncegate's effects API: Client.Do runs a side
// effect that an intent's answer drives (a tool call, a charge, a message) once, however
// often the caller's whole loop is retried, and returns the result recorded the first time
// to every repeat.
//
// The pattern: send the model call with an Idempotency-Key (or keep the auto key oncegate
// echoes in Idempotency-Key); a retry of the loop gets the same answer, tool-call ids
// included, so a tool call's id names its effect stably. For each tool call:
//
//	out, err := c.Do(ctx, key, call.ID, call.Arguments, func(ctx context.Context, effectKey string) (any, error) {
//		return sendEmail(ctx, args, effectKey) // effectKey: the downstream system's idempotency key
//	})
//
// Do claims the effect, runs fn, and records fn's result; a repeat (the same intent and name)
// gets the recorded result without running fn. Another caller running it at the moment is
// waited for (the server's Retry-After, bounded by ctx). The arguments are part of the
// effect: the same name with other arguments is ErrArgumentsChanged.
//
// When fn fails, Do cannot know whether the effect happened, and assumes it may have: it
// reports the outcome unknown (the effect then needs reconciling, and nobody runs it again
// silently) and returns ErrOutcomeUnknown. An fn that knows it did nothing (it failed before
// it reached the downstream system) returns NotRun(err): Do releases the claim, and the next
// Do runs the effect. While fn runs, Do renews the claim's lease; should the claim be lost
// all the same (the gateway unreachable past the lease, and another caller found it lapsed),
// fn's context is cancelled with ErrStaleFence. A panicking fn, or a caller that dies, leaves
// the claim to its lease:
// after it the effect needs reconciling too. An effect that needs reconciling is given to
// Client.Reconcile when it is set (look downstream with the effect key: found, its result is
// recorded; not found, the effect runs), else Do returns a *ReconcileError.
//
// A Client is safe for concurrent use. It imports nothing of oncegate but the wire format.
package effects

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Errors of Do.
var (
	// ErrArgumentsChanged: the effect was claimed before with other arguments (422).
	ErrArgumentsChanged = errors.New("effects: the effect was claimed with other arguments")
	// ErrNeedsReconcile: the effect's outcome is unknown and no Reconcile is set (a
	// *ReconcileError says which effect).
	ErrNeedsReconcile = errors.New("effects: the effect's outcome is unknown; reconcile it")
	// ErrOutcomeUnknown: fn failed, and the effect was reported as possibly run: it needs
	// reconciling. fn's error is wrapped too.
	ErrOutcomeUnknown = errors.New("effects: fn failed; the effect may have run and needs reconciling")
	// ErrStaleFence: fn ran, but its claim's lease had run out and another claim took the
	// effect over before its result was recorded; fn's result is returned with it.
	ErrStaleFence = errors.New("effects: the claim lapsed before its result was recorded")
	// ErrNotRun marks an fn error that says the effect surely did not happen (NotRun).
	ErrNotRun = errors.New("effects: the effect did not run")
)

// NotRun marks err, returned by fn, as a failure that surely did not run the effect: Do then
// releases its claim instead of reporting the outcome unknown.
func NotRun(err error) error { return fmt.Errorf("%w: %w", ErrNotRun, err) }

// ReconcileError is ErrNeedsReconcile for one effect: look downstream with EffectKey, then
// complete it with Fence (PUT …/effects/{name}) or claim it again with "reconciled": true.
type ReconcileError struct {
	Intent, Name, EffectKey string
	Fence                   uint64
	Attempt                 int
}

func (e *ReconcileError) Error() string {
	return fmt.Sprintf("effects: %s of %s needs reconciling (effect key %s, fence %d)", e.Name, e.Intent, e.EffectKey, e.Fence)
}

// Is makes a ReconcileError match ErrNeedsReconcile.
func (e *ReconcileError) Is(target error) bool { return target == ErrNeedsReconcile }

// APIError is an answer of the API that Do does not handle itself (its status, and the code
// and message of its error body).
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("effects: HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Client calls one gateway's effects API.
type Client struct {
	// BaseURL is the gateway's, e.g. "http://127.0.0.1:8080".
	BaseURL string
	// APIKey is sent as Authorization: Bearer ("": none, a gateway without tenants).
	APIKey string
	// HTTP is the client used (nil: http.DefaultClient).
	HTTP *http.Client
	// Lease is how long a claim holds the effect without a renewal (0: one minute, at least
	// 100 ms): Do renews it every third of it while fn runs, so only a caller that stops
	// (dies, hangs, loses the gateway) lets it lapse.
	Lease time.Duration
	// Reconcile, when set, is asked about an effect whose outcome is unknown: its result
	// when the effect happened (found), or found false when it surely did not (Do then runs
	// it). Look it up downstream by effectKey.
	Reconcile func(ctx context.Context, effectKey string) (result json.RawMessage, found bool, err error)
}

// Fingerprint is the hex SHA-256 of args as canonical JSON: encoding/json's, with object
// keys sorted at every depth (json.RawMessage and strings of JSON are read as JSON first).
func Fingerprint(args any) (string, error) {
	var raw []byte
	switch a := args.(type) {
	case json.RawMessage:
		raw = a
	case []byte:
		raw = a
	default:
		b, err := json.Marshal(args)
		if err != nil {
			return "", fmt.Errorf("effects: fingerprint: %w", err)
		}
		raw = b
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "", fmt.Errorf("effects: fingerprint: %w", err)
	}
	canon, err := json.Marshal(v) // maps marshal with sorted keys
	if err != nil {
		return "", fmt.Errorf("effects: fingerprint: %w", err)
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

// view is an effect as the API answers it.
type view struct {
	State     string          `json:"state"`
	Attempt   int             `json:"attempt"`
	Fence     uint64          `json:"fence"`
	EffectKey string          `json:"effect_key"`
	Result    json.RawMessage `json:"result"`
}

// Do runs fn once for the effect name of intent (its Idempotency-Key, or the auto key the
// answer echoed) with args, and returns its recorded result: fn's, JSON-encoded (a
// json.RawMessage as it is), the first time; the same bytes on every repeat.
func (c *Client) Do(ctx context.Context, intent, name string, args any, fn func(ctx context.Context, effectKey string) (any, error)) (json.RawMessage, error) {
	fp, err := Fingerprint(args)
	if err != nil {
		return nil, err
	}
	claim := map[string]any{"fingerprint": fp, "lease_ms": c.lease().Milliseconds(), "claim_id": rand.Text()}
	for {
		status, h, v, err := c.call(ctx, http.MethodPost, intent, name, "", claim)
		switch {
		case err != nil:
			return nil, err
		case status == http.StatusCreated:
			return c.run(ctx, intent, name, v, fn)
		case status == http.StatusOK && v.State == "completed":
			return v.Result, nil
		case status == http.StatusConflict && v.State == "in_progress":
			if err := wait(ctx, retryAfter(h)); err != nil {
				return nil, err
			}
		case status == http.StatusConflict && v.State == "needs_reconcile":
			if c.Reconcile == nil {
				return nil, &ReconcileError{Intent: intent, Name: name, EffectKey: v.EffectKey, Fence: v.Fence, Attempt: v.Attempt}
			}
			res, found, err := c.Reconcile(ctx, v.EffectKey)
			if err != nil {
				return nil, err
			}
			if found {
				return c.complete(ctx, intent, name, v.Fence, res)
			}
			claim["reconciled"] = true
		default:
			return nil, fmt.Errorf("effects: claim %s: unexpected answer %d %s", name, status, v.State)
		}
	}
}

// run runs fn under the claim v and records what became of it.
func (c *Client) run(ctx context.Context, intent, name string, v view, fn func(context.Context, string) (any, error)) (json.RawMessage, error) {
	fctx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	stop := c.keepRenewing(fctx, lost, intent, name, v.Fence)
	out, ferr := fn(fctx, v.EffectKey)
	stop()
	if ferr != nil {
		report := "unknown"
		if errors.Is(ferr, ErrNotRun) {
			report = "release"
		}
		rctx, cancel := detached(ctx) // fn may have failed because ctx ended
		defer cancel()
		if _, _, _, err := c.call(rctx, http.MethodPost, intent, name, "/"+report, map[string]any{"fence": v.Fence}); err != nil {
			return nil, fmt.Errorf("effects: %s: reporting %s: %w (fn: %w)", name, report, err, ferr)
		}
		if report == "unknown" {
			return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ferr)
		}
		return nil, ferr
	}
	var res json.RawMessage
	switch o := out.(type) {
	case json.RawMessage:
		res = o
	default:
		b, err := json.Marshal(out)
		if err != nil {
			return nil, fmt.Errorf("effects: %s: encoding fn's result: %w", name, err)
		}
		res = b
	}
	rctx, cancel := detached(ctx) // the effect happened: its record must not be lost to ctx's end
	defer cancel()
	return c.complete(rctx, intent, name, v.Fence, res)
}

// detached is a context for what must be written after fn, whatever became of ctx: its values,
// not its end, and at most 30 s.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

// keepRenewing renews the claim held by fence every third of the lease until stop is called;
// when the claim is lost (another claim took it over after a lapse), it cancels fn's context
// with ErrStaleFence.
func (c *Client) keepRenewing(ctx context.Context, cancel context.CancelCauseFunc, intent, name string, fence uint64) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(c.lease() / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			_, _, _, err := c.call(ctx, http.MethodPost, intent, name, "/renew", map[string]any{"fence": fence, "lease_ms": c.lease().Milliseconds()})
			var ae *APIError
			if errors.Is(err, ErrStaleFence) || errors.As(err, &ae) && ae.Status == http.StatusConflict {
				cancel(fmt.Errorf("%w: %w", ErrStaleFence, err))
				return
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// complete records res as the effect's result with fence.
func (c *Client) complete(ctx context.Context, intent, name string, fence uint64, res json.RawMessage) (json.RawMessage, error) {
	if !json.Valid(res) {
		return nil, fmt.Errorf("effects: complete %s: the result is not JSON", name)
	}
	// Written by hand: encoding/json would compact the result, which is recorded byte for byte.
	body := json.RawMessage(`{"fence":` + strconv.FormatUint(fence, 10) + `,"result":` + string(res) + `}`)
	status, _, v, err := c.call(ctx, http.MethodPut, intent, name, "", body)
	switch {
	case err != nil:
		return res, err
	case status != http.StatusOK:
		return res, fmt.Errorf("effects: complete %s: unexpected answer %d", name, status)
	}
	return v.Result, nil
}

func (c *Client) lease() time.Duration {
	if c.Lease > 0 {
		return c.Lease
	}
	return time.Minute
}

// maxTries bounds the sends of one request that got no answer, or a 503 (each is safe to
// send again: a claim carries its claim_id, a completion or report its fence).
const maxTries = 5

// call sends one request of the API (suffix: "", "/unknown", "/release" or "/renew"; body a value to
// encode, or a json.RawMessage sent as it is) and decodes its
// answer: the effect's view for 2xx and the state answers (409 in_progress, needs_reconcile);
// the sentinels for the errors Do knows; an *APIError for any other.
func (c *Client) call(ctx context.Context, method, intent, name, suffix string, body any) (int, http.Header, view, error) {
	payload, raw := body.(json.RawMessage) // sent as it is
	if !raw {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, view{}, err
		}
		payload = b
	}
	u := strings.TrimSuffix(c.BaseURL, "/") + "/v1/idempotency/" + url.PathEscape(intent) + "/effects/" + url.PathEscape(name) + suffix
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	var lastErr error
	for try := range maxTries {
		if try > 0 {
			if err := wait(ctx, time.Duration(try)*200*time.Millisecond); err != nil {
				return 0, nil, view{}, fmt.Errorf("%w (last: %w)", err, lastErr)
			}
		}
		req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(payload))
		if err != nil {
			return 0, nil, view{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		if c.APIKey != "" {
			req.Header.Set("Authorization", "Bearer "+c.APIKey)
		}
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil, view{}, err
			}
			lastErr = err
			continue
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			lastErr = err
			continue
		}
		if resp.StatusCode == http.StatusServiceUnavailable {
			lastErr = answerError(resp.StatusCode, data)
			continue
		}
		return decodeAnswer(resp.StatusCode, resp.Header, data)
	}
	return 0, nil, view{}, lastErr
}

// decodeAnswer reads one answer of the API.
func decodeAnswer(status int, h http.Header, data []byte) (int, http.Header, view, error) {
	var v view
	if status < 300 || status == http.StatusConflict {
		if err := json.Unmarshal(data, &v); err != nil {
			return 0, nil, view{}, fmt.Errorf("effects: an answer %d that is not an effect: %w", status, err)
		}
		if v.State != "" {
			return status, h, v, nil
		}
	}
	return 0, nil, view{}, answerError(status, data)
}

// answerError is the error of an API error answer.
func answerError(status int, data []byte) error {
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(data, &body)
	ae := &APIError{Status: status, Code: body.Error.Code, Message: body.Error.Message}
	switch ae.Code {
	case "effect_arguments_changed":
		return fmt.Errorf("%w: %w", ErrArgumentsChanged, ae)
	case "effect_stale_fence":
		return fmt.Errorf("%w: %w", ErrStaleFence, ae)
	}
	return ae
}

// retryAfter is an answer's Retry-After (whole seconds), at least a second.
func retryAfter(h http.Header) time.Duration {
	secs, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || secs < 1 {
		secs = 1
	}
	return time.Duration(secs) * time.Second
}

// wait waits d, or until ctx ends (its error).
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
