package intent

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Tenant limits: caps on what one tenant may hold or send, so a tenant at ten times its cap
// gets 429s while the others keep their goodput. Each API node enforces its share of every
// cap (the gateway divides the configured cap by admission.api_nodes), so the nodes together
// can never exceed it, with no write per request: a counter replicated through NATS would
// cost a synced round trip at every admission and every end. A tenant whose load lands on one
// node gets that node's share only; that is the price of not overshooting.
//
// What each cap counts:
//   - Executions: the tenant's new executions admitted here and not answered (as
//     MaxExecutions, per tenant). Copies of existing intents are never refused by it.
//   - Streams: the tenant's streamed answers being delivered here (new ones and joins).
//   - FollowersPerJob: the copies following one execution here.
//   - RequestsPerSecond and Burst: a token bucket over every model request (copies included).
//   - TokensPerMinute: a token bucket over what a new execution may use (its estimated input
//     and its max_tokens), counted at admission, as the providers count it.

// Limits are one tenant's caps on this node; 0 is no cap.
type Limits struct {
	Executions      int
	Streams         int
	FollowersPerJob int
	// RequestsPerSecond refills a bucket of Burst requests (Burst 0: the rate, at least 1).
	RequestsPerSecond float64
	Burst             int
	TokensPerMinute   int
}

// ErrTenantLimit: a tenant's cap refused the request (a *LimitError says which); nothing was
// written.
var ErrTenantLimit = errors.New("intent: the tenant's limit is reached")

// LimitError is a refusal by one of a tenant's caps.
type LimitError struct {
	// Limit names the cap: executions, streams, followers_per_job, requests_per_second or
	// tokens_per_minute.
	Limit string
	// Cap is this node's share of it.
	Cap float64
	// RetryAfter is when the same request may pass; 0 with TooLarge.
	RetryAfter time.Duration
	// TooLarge: the request alone needs more than the cap (its tokens): no retry can pass.
	TooLarge bool
}

func (e *LimitError) Error() string {
	if e.TooLarge {
		return fmt.Sprintf("the request needs more tokens than this tenant's tokens_per_minute allows on this node (%g)", e.Cap)
	}
	return fmt.Sprintf("this tenant's %s limit is reached (%g on this node); retry after %s", e.Limit, e.Cap, e.RetryAfter.Round(time.Millisecond))
}

// Is makes a LimitError an ErrTenantLimit.
func (e *LimitError) Is(target error) bool { return target == ErrTenantLimit }

// heldRetry is the Retry-After of a cap on things held (executions, streams, followers): a
// generation takes seconds, so one second is a fair first wait.
const heldRetry = time.Second

// tenantLimits is one tenant's caps and what it holds of them here. A nil *tenantLimits has no
// caps (every method admits).
type tenantLimits struct {
	Limits
	executions, streams atomic.Int64
	requests, tokens    *bucket // nil: no cap
}

// newTenantLimits builds the tenants' limiters (nil entries for tenants without caps).
func newTenantLimits(m map[string]Limits) map[string]*tenantLimits {
	out := make(map[string]*tenantLimits, len(m))
	for tenant, l := range m {
		if l == (Limits{}) {
			continue
		}
		t := &tenantLimits{Limits: l}
		if l.RequestsPerSecond > 0 {
			burst := l.Burst
			if burst <= 0 {
				burst = max(1, int(math.Ceil(l.RequestsPerSecond)))
			}
			t.requests = newBucket(l.RequestsPerSecond, float64(burst))
		}
		if l.TokensPerMinute > 0 {
			t.tokens = newBucket(float64(l.TokensPerMinute)/60, float64(l.TokensPerMinute))
		}
		out[tenant] = t
	}
	return out
}

// capsFollowers: some tenant has a followers-per-job cap (the followers count must run).
func capsFollowers(m map[string]*tenantLimits) bool {
	for _, t := range m {
		if t.FollowersPerJob > 0 {
			return true
		}
	}
	return false
}

// limitsOf is tenant's limiter; nil when it has no caps.
func (c *Core) limitsOf(tenant string) *tenantLimits { return c.limits[tenant] }

// request takes one request from the tenant's requests-per-second bucket.
func (t *tenantLimits) request(now time.Time) error {
	if t == nil || t.requests == nil {
		return nil
	}
	_, err := t.requests.take(now, 1, "requests_per_second")
	return err
}

// spendTokens takes n tokens (a new execution's estimate) from the tokens-per-minute bucket;
// unspend puts them back (an execution that never ran).
func (t *tenantLimits) spendTokens(now time.Time, n int) (unspend func(), err error) {
	if t == nil || t.tokens == nil {
		return func() {}, nil
	}
	return t.tokens.take(now, float64(n), "tokens_per_minute")
}

// bucket is a token bucket that can take back what it gave: golang.org/x/time/rate's Cancel
// restores nothing once a reservation's time has passed, and a claim learns that its key was
// already taken (a copy, which must cost the tenant nothing) only after its admission.
type bucket struct {
	mu       sync.Mutex
	perSec   float64
	capacity float64
	level    float64
	at       time.Time // of level; zero: full
}

func newBucket(perSec, capacity float64) *bucket {
	return &bucket{perSec: perSec, capacity: capacity, level: capacity}
}

// take takes n at once or not at all; a refusal says when n will be there, or that n is more
// than the bucket ever holds. undo gives them back.
func (b *bucket) take(now time.Time, n float64, name string) (undo func(), err error) {
	if n > b.capacity {
		return nil, &LimitError{Limit: name, Cap: b.capacity, TooLarge: true}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.at.IsZero() && now.After(b.at) {
		b.level = min(b.capacity, b.level+now.Sub(b.at).Seconds()*b.perSec)
	}
	if now.After(b.at) {
		b.at = now
	}
	if b.level < n {
		wait := time.Duration((n - b.level) / b.perSec * float64(time.Second))
		return nil, &LimitError{Limit: name, Cap: b.capacity, RetryAfter: max(wait, time.Millisecond)}
	}
	b.level -= n
	var undone atomic.Bool
	return func() {
		if undone.CompareAndSwap(false, true) {
			b.mu.Lock()
			b.level = min(b.capacity, b.level+n)
			b.mu.Unlock()
		}
	}, nil
}

// hold takes one of a held cap (executions or streams); release (idempotent) gives it back.
func hold(n *atomic.Int64, capacity int, name string) (release func(), err error) {
	if capacity <= 0 {
		return func() {}, nil
	}
	if n.Add(1) > int64(capacity) {
		n.Add(-1)
		return nil, &LimitError{Limit: name, Cap: float64(capacity), RetryAfter: heldRetry}
	}
	var released atomic.Bool
	return func() {
		if released.CompareAndSwap(false, true) {
			n.Add(-1)
		}
	}, nil
}

func (t *tenantLimits) execution() (func(), error) {
	if t == nil {
		return func() {}, nil
	}
	return hold(&t.executions, t.Executions, "executions")
}

func (t *tenantLimits) stream() (func(), error) {
	if t == nil {
		return func() {}, nil
	}
	return hold(&t.streams, t.Streams, "streams")
}

func (t *tenantLimits) followersPerJob() int {
	if t == nil {
		return 0
	}
	return t.FollowersPerJob
}

// both runs a and then b, each once.
func both(a, b func()) func() {
	return func() { a(); b() }
}
