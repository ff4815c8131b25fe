package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/oncegate/oncegate/internal/clock"
)

// scenario is what one intent of a run does. Implementations are stateless apart from their
// configuration; per-target state (the replay pool) lives in the target.
type scenario interface {
	// width is how many requests one intent may have in flight at once.
	width() int
	// opBound bounds how long one intent may take.
	opBound() time.Duration
	// prepare runs once per target before the warm-up.
	prepare(ctx context.Context, r *runner, t *target) error
	// op runs intent seq against t and records it in tl. It returns false, having sent
	// nothing, when the target's request cap is reached.
	op(ctx context.Context, r *runner, t *target, seq int64, tl *tally) bool
}

// Fanout's long stream when --mock-tokens / --mock-itl are not given: 200 tokens 5 ms apart.
const (
	fanoutTokens     = 200
	fanoutInterToken = 5 * time.Millisecond
)

// Retry policy of the official SDKs (see shared/notes/idempotency-semantics.md, part D).
const (
	retryInitial     = 500 * time.Millisecond
	retryMax         = 8 * time.Second
	retryAfterMaxSDK = 60 * time.Second // a longer server-directed delay falls back to backoff
)

func newScenario(c *Config) scenario {
	keys := effectiveKeys(c)
	b := bodies{knobs: c.Mock}
	switch c.Scenario {
	case ScenarioDuplicates:
		return &duplicates{cfg: c, b: b, keys: keys}
	case ScenarioRetryStorm:
		return &retryStorm{cfg: c, b: b, keys: keys}
	case ScenarioFanout:
		if b.knobs.Tokens == nil {
			n := fanoutTokens
			b.knobs.Tokens = &n
		}
		if b.knobs.InterToken == nil {
			d := fanoutInterToken
			b.knobs.InterToken = &d
		}
		return &fanout{cfg: c, b: b, keys: keys}
	case ScenarioReplay:
		return &replay{cfg: c, b: b, keys: keys}
	}
	return &overhead{cfg: c, b: b, keys: keys}
}

// bodies builds request bodies; the model is the target's (a router such as Bifrost names it
// with a provider prefix that the backend itself does not know).
type bodies struct {
	knobs MockKnobs
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type mockBody struct {
	Tokens       *int   `json:"tokens,omitempty"`
	InterTokenMs *int64 `json:"inter_token_ms,omitempty"`
	TTFTMs       *int64 `json:"ttft_ms,omitempty"`
	Fault        string `json:"fault,omitempty"`
}

type chatBody struct {
	Model    string        `json:"model"`
	Messages []chatMessage `json:"messages"`
	Stream   bool          `json:"stream"`
	Mock     *mockBody     `json:"mock,omitempty"`
}

func (b bodies) make(model, text string, stream bool) []byte {
	cb := chatBody{Model: model, Messages: []chatMessage{{Role: "user", Content: text}}, Stream: stream}
	k := b.knobs
	if k.Tokens != nil || k.InterToken != nil || k.TTFT != nil || k.Fault != "" {
		msOf := func(d *time.Duration) *int64 {
			if d == nil {
				return nil
			}
			v := d.Milliseconds()
			return &v
		}
		cb.Mock = &mockBody{Tokens: k.Tokens, InterTokenMs: msOf(k.InterToken), TTFTMs: msOf(k.TTFT), Fault: k.Fault}
	}
	out, err := json.Marshal(cb)
	if err != nil {
		panic("bench: marshal request body: " + err.Error()) // strings, ints and pointers always marshal
	}
	return out
}

// intent returns the key and prompt of intent seq on t: unique per run, target and number, and
// padded to --prompt-bytes.
func (r *runner) intent(t *target, seq int64) (key, text string) {
	return fmt.Sprintf("bench-%s-%s-%d", r.runID, t.label, seq),
		padPrompt(fmt.Sprintf("oncegate bench %s target %s intent %d: write a short answer.", r.runID, t.label, seq), r.filler, r.cfg.PromptBytes)
}

// padPrompt returns text followed by the start of filler (Words of at least n bytes) up to n
// bytes (text alone if it is longer).
func padPrompt(text, filler string, n int) string {
	if len(text) >= n {
		return text
	}
	return text + " " + filler[:n-len(text)-1]
}

func (r *runner) do(ctx context.Context, a attempt) outcome {
	a.header = r.header
	return do(ctx, r.client, r.cfg.Timeout, a)
}

func keyIf(send bool, key string) string {
	if send {
		return key
	}
	return ""
}

// overhead: every request a new intent with its own key; the gateway's cost per request.
type overhead struct {
	cfg  *Config
	b    bodies
	keys bool
}

func (s *overhead) width() int                                      { return 1 }
func (s *overhead) opBound() time.Duration                          { return s.cfg.Timeout }
func (s *overhead) prepare(context.Context, *runner, *target) error { return nil }

func (s *overhead) op(ctx context.Context, r *runner, t *target, seq int64, tl *tally) bool {
	if !t.reserve(1) {
		return false
	}
	key, text := r.intent(t, seq)
	o := r.do(ctx, attempt{url: t.chatURL, key: keyIf(s.keys, key), body: s.b.make(t.model, text, s.cfg.Stream),
		stream: s.cfg.Stream, retryCount: -1})
	tl.addRequest(&o)
	tl.addIntent(o.kind == "", o.latency, false)
	return true
}

// duplicates: Copies copies of each intent, released together; with or without a key.
type duplicates struct {
	cfg  *Config
	b    bodies
	keys bool
}

func (s *duplicates) width() int                                      { return s.cfg.Copies }
func (s *duplicates) opBound() time.Duration                          { return s.cfg.Timeout }
func (s *duplicates) prepare(context.Context, *runner, *target) error { return nil }

func (s *duplicates) op(ctx context.Context, r *runner, t *target, seq int64, tl *tally) bool {
	if !t.reserve(int64(s.cfg.Copies)) {
		return false
	}
	key, text := r.intent(t, seq)
	a := attempt{url: t.chatURL, key: keyIf(s.keys, key), body: s.b.make(t.model, text, s.cfg.Stream),
		stream: s.cfg.Stream, retryCount: -1}
	outs := make([]outcome, s.cfg.Copies)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() {
			<-release
			outs[i] = r.do(ctx, a)
		})
	}
	start := time.Now()
	close(release)
	wg.Wait()
	ok, divergent := true, false
	var digest uint64
	seen := false
	for i := range outs {
		tl.addRequest(&outs[i])
		if outs[i].kind != "" {
			ok = false
			continue
		}
		if seen && outs[i].digest != digest {
			divergent = true
		}
		digest, seen = outs[i].digest, true
	}
	tl.addIntent(ok, time.Since(start), divergent)
	return true
}

// retryStorm: each intent is one call of an SDK-like client: a short per-attempt timeout,
// Retries retries with the SDKs' backoff, x-stainless-retry-count on every attempt, and the
// server's x-should-retry / retry-after-ms / Retry-After honored.
type retryStorm struct {
	cfg  *Config
	b    bodies
	keys bool
}

func (s *retryStorm) width() int { return 1 }
func (s *retryStorm) opBound() time.Duration {
	n := time.Duration(s.cfg.Retries)
	return (n+1)*s.cfg.Timeout + n*retryAfterMaxSDK
}
func (s *retryStorm) prepare(context.Context, *runner, *target) error { return nil }

func (s *retryStorm) op(ctx context.Context, r *runner, t *target, seq int64, tl *tally) bool {
	if !t.reserve(1) {
		return false
	}
	key, text := r.intent(t, seq)
	a := attempt{url: t.chatURL, key: keyIf(s.keys, key), body: s.b.make(t.model, text, s.cfg.Stream),
		stream: s.cfg.Stream, idle: s.cfg.ClientTimeout}
	start := time.Now()
	for n := 0; ; n++ {
		a.retryCount = n
		o := r.do(ctx, a)
		tl.addRequest(&o)
		if o.kind == "" {
			tl.addIntent(true, time.Since(start), false)
			return true
		}
		if n >= s.cfg.Retries || !shouldRetry(&o, a.stream) || !clock.Sleep(ctx, retryDelay(o.hints, n, rand.Float64())) || // #nosec G404 -- the bench client's retry jitter, not a secret
			!t.reserve(1) {
			tl.addIntent(false, time.Since(start), false)
			return true
		}
		tl.addRetry()
	}
}

// shouldRetry is the SDKs' decision after a failed attempt: x-should-retry wins; else
// connection errors, timeouts, 408, 409, 429 and 5xx are retried. A stream that already got
// its 200 is never retried (the SDKs raise mid-stream failures to the caller).
func shouldRetry(o *outcome, stream bool) bool {
	if stream && o.status == 200 {
		return false
	}
	switch o.hints.shouldRetry {
	case "true":
		return true
	case "false":
		return false
	}
	if o.status == 0 || o.status == 200 { // no response, or a broken non-stream body
		return o.kind != KindCanceled
	}
	return o.status == 408 || o.status == 409 || o.status == 429 || o.status >= 500
}

// retryDelay is the SDKs' wait before retry number n+1 (n retries taken so far): the server's
// retry-after-ms or Retry-After when 0 < d ≤ 60 s, else min(0.5 s·2^n, 8 s) minus up to 25 %
// jitter (jitter in [0, 1)).
func retryDelay(h retryHints, n int, jitter float64) time.Duration {
	if h.hasAfter && h.after > 0 && h.after <= retryAfterMaxSDK {
		return h.after
	}
	d := min(float64(retryInitial)*math.Pow(2, float64(min(n, 30))), float64(retryMax))
	return time.Duration(d * (1 - 0.25*jitter))
}

// fanout: one long stream; once its first chunk arrived, Subscribers late copies of it (same
// key, stream: true) attach. Lag of chunk i for a subscriber = its arrival time of chunk i
// minus the first stream's arrival time of chunk i.
type fanout struct {
	cfg  *Config
	b    bodies
	keys bool
}

func (s *fanout) width() int                                      { return s.cfg.Subscribers + 1 }
func (s *fanout) opBound() time.Duration                          { return 2 * s.cfg.Timeout }
func (s *fanout) prepare(context.Context, *runner, *target) error { return nil }

func (s *fanout) op(ctx context.Context, r *runner, t *target, seq int64, tl *tally) bool {
	if !t.reserve(int64(s.cfg.Subscribers) + 1) {
		return false
	}
	key, text := r.intent(t, seq)
	a := attempt{url: t.chatURL, key: keyIf(s.keys, key), body: s.b.make(t.model, text, true), stream: true,
		retryCount: -1, arrivals: true}
	start := time.Now()
	first := make(chan struct{})
	var once sync.Once
	signal := func() { once.Do(func() { close(first) }) }
	var wg sync.WaitGroup
	var lead outcome
	wg.Go(func() {
		defer signal()
		la := a
		la.onFirst = signal
		lead = r.do(ctx, la)
	})
	<-first
	subs := make([]outcome, s.cfg.Subscribers)
	for i := range subs {
		wg.Go(func() { subs[i] = r.do(ctx, a) })
	}
	wg.Wait()

	f := &fanTally{rounds: 1, subscribers: int64(len(subs)), chunks: lead.chunks}
	tl.addRequest(&lead)
	ok := lead.kind == ""
	for i := range subs {
		sub := &subs[i]
		tl.addRequest(sub)
		ok = ok && sub.kind == ""
		f.bytes += sub.bytes
		if sub.kind == "" && lead.kind == "" && sub.chunks == lead.chunks {
			if sub.digest == lead.digest {
				f.complete++
			} else {
				f.mismatched++
			}
		} else if sub.kind == "" && lead.kind == "" {
			f.mismatched++
		}
		for j := range min(len(sub.arrivals), len(lead.arrivals)) {
			lag := sub.arrivals[j].Sub(lead.arrivals[j])
			f.lag.Record(lag)
			if !sub.headers.IsZero() && lead.arrivals[j].After(sub.headers) {
				f.liveLag.Record(lag)
			}
		}
	}
	tl.addFanout(f)
	tl.addIntent(ok, time.Since(start), false)
	return true
}

// pooled is one completed intent of the replay pool.
type pooled struct {
	key  string
	body []byte
}

// replay: KeysPool intents are completed first (not measured); the load then requests them
// again, round robin.
type replay struct {
	cfg  *Config
	b    bodies
	keys bool
}

func (s *replay) width() int             { return 1 }
func (s *replay) opBound() time.Duration { return s.cfg.Timeout }

func (s *replay) prepare(ctx context.Context, r *runner, t *target) error {
	t.pool = make([]pooled, s.cfg.KeysPool)
	for i := range t.pool {
		key, text := r.intent(t, t.seq.Add(1)-1)
		t.pool[i] = pooled{key: keyIf(s.keys, key), body: s.b.make(t.model, text, s.cfg.Stream)}
	}
	var (
		mu     sync.Mutex
		failed int
		first  error
		next   int
		wg     sync.WaitGroup
	)
	for range min(s.cfg.Concurrency, len(t.pool)) {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(t.pool) || ctx.Err() != nil {
					return
				}
				o := r.do(ctx, attempt{url: t.chatURL, key: t.pool[i].key, body: t.pool[i].body,
					stream: s.cfg.Stream, retryCount: -1})
				if o.kind != "" {
					mu.Lock()
					failed++
					if first == nil {
						first = fmt.Errorf("%s (HTTP %d)", o.kind, o.status)
						if o.err != nil {
							first = fmt.Errorf("%s: %w", o.kind, o.err)
						}
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("completing the key pool: %w", err)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d pool intents failed, first: %w", failed, len(t.pool), first)
	}
	return nil
}

func (s *replay) op(ctx context.Context, r *runner, t *target, seq int64, tl *tally) bool {
	if !t.reserve(1) {
		return false
	}
	p := t.pool[int(seq)%len(t.pool)]
	o := r.do(ctx, attempt{url: t.chatURL, key: p.key, body: p.body, stream: s.cfg.Stream, retryCount: -1})
	tl.addRequest(&o)
	tl.addIntent(o.kind == "", o.latency, false)
	return true
}
