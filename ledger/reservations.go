package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsretry"
)

// BudgetBucket is the KV bucket that holds every budgeted tenant's outstanding reservations
// and settle holds, shared by all API nodes: one key per tenant, changed only by
// compare-and-set.
const BudgetBucket = "BUDGETS"

const (
	// DefaultReservationTTL is how long a reservation counts after its node last renewed it.
	// A node renews its reservations every TTL/4 while they are held, so a live one outlasts
	// three failed renewals (a leader election is 4-9 s); a node that dies stops renewing, and
	// its reservations stop blocking the tenant at most this long after its last renewal. The
	// expiry is compared with each node's clock: clocks of API nodes that differ by more than
	// TTL·3/4 (45 s) can let another node drop a live reservation early.
	DefaultReservationTTL = time.Minute
	// DefaultReservationMax bounds how long a reservation is renewed if it is never released:
	// longer than an HTTP request follows an execution (httpapi's 15 minutes).
	DefaultReservationMax = 20 * time.Minute
)

// ErrBudgetUnavailable is returned by Budgets.Reserve and Status when the shared reservations
// could not be read or changed: NATS did not answer within the call's bounds, or other nodes
// changed the tenant's reservations under every attempt. Nothing was reserved; a retry is safe.
var ErrBudgetUnavailable = errors.New("ledger: budget reservations unavailable")

// WithReservationTTL sets how long a reservation counts after its last renewal (see
// DefaultReservationTTL); it is renewed every ttl/4.
func WithReservationTTL(ttl time.Duration) BudgetOption {
	return func(b *Budgets) { b.ttl = ttl }
}

// WithBudgetReplicas sets the replicas BudgetBucket is created with, and raised to on an
// existing bucket that has fewer (never lowered). 0, the default, follows LEDGER's replicas.
func WithBudgetReplicas(n int) BudgetOption { return func(b *Budgets) { b.replicas = n } }

// reservation is one admitted estimate (or, Settled, the actual cost of a released one during
// its settle hold) in a tenant's shared list. Until is by the writer's clock.
type reservation struct {
	ID      string `json:"i"`
	Micros  int64  `json:"m"`
	Until   int64  `json:"u"` // unix milliseconds
	Settled bool   `json:"s,omitempty"`
	// Job is the execution a settle hold stands in for (ReserveJob): once the ledger shows a
	// charge of it, the hold no longer counts (the charge does).
	Job string `json:"j,omitempty"`
}

// reservations is the value of a tenant's key in BudgetBucket.
type reservations struct {
	List []reservation `json:"r"`
}

// live drops the entries expired at now, and the settle holds of jobs charged says the ledger
// has a charge of (nil: none), and sums the others.
func (rs *reservations) live(now time.Time, charged func(job string) bool) int64 {
	ms := now.UnixMilli()
	var sum int64
	kept := rs.List[:0]
	for _, r := range rs.List {
		if r.Until <= ms || (r.Settled && r.Job != "" && charged != nil && charged(r.Job)) {
			continue
		}
		kept = append(kept, r)
		sum += r.Micros
	}
	rs.List = kept
	return sum
}

// find is the index of the entry with id, or -1.
func (rs *reservations) find(id string) int {
	for i := range rs.List {
		if rs.List[i].ID == id {
			return i
		}
	}
	return -1
}

// newReservationID is a random id: a retried write that had already succeeded finds its own
// entry by it, so no change is applied twice.
func newReservationID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// reservationKey is tenant's key in BudgetBucket (the hash of its ledger subject: client text
// never becomes a key).
func reservationKey(tenant string) string {
	return strings.TrimPrefix(Subject(tenant), subjectPrefix)
}

const (
	// budgetAttempts bounds the reads and writes of one change of a tenant's reservations.
	budgetAttempts = 32
	// budgetCallTimeout bounds one change when the caller's context has no earlier deadline;
	// it rides out a leader election.
	budgetCallTimeout = 12 * time.Second
)

// change applies fn to tenant key's reservations and writes the result with compare-and-set,
// re-reading and re-applying fn when another node wrote first. fn returns whether it changed
// anything (nothing is written otherwise) or an error that ends the change as it is (a
// *BudgetError). fn must be idempotent by reservation id: a write whose answer was lost
// (a timeout) is tried again.
func (b *Budgets) change(ctx context.Context, key string, fn func(rs *reservations, now time.Time) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, budgetCallTimeout)
	defer cancel()
	pause := 20 * time.Millisecond
	var last error
	for range budgetAttempts {
		// Each attempt has its own bound: a request whose answer was lost (the stream had no
		// leader yet, a server died under it) must not use up the whole window, as one did on
		// a loaded CI machine right after the bucket was created on three replicas.
		actx, acancel := context.WithTimeout(ctx, jsretry.PerTry)
		kvs, err := b.bucket(actx)
		if err == nil {
			var done bool
			if done, err = b.try(actx, kvs, key, fn); done {
				acancel()
				return err
			}
		}
		acancel()
		if err == nil {
			continue // another node wrote first: read again
		}
		last = err
		b.dropBucket() // a lost or moved bucket is opened again
		if ctx.Err() != nil || b.l.js.Conn().IsClosed() {
			break
		}
		select { // NATS did not answer: an election or a reconnect is under way
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
	if last == nil {
		return fmt.Errorf("%w: %d compare-and-set conflicts on %s", ErrBudgetUnavailable, budgetAttempts, key)
	}
	return fmt.Errorf("%w: %v", ErrBudgetUnavailable, last)
}

// try is one read, fn, and conditional write. done is false (with a nil error) when the
// write lost a compare-and-set, and with an error when NATS failed.
func (b *Budgets) try(ctx context.Context, kvs jetstream.KeyValue, key string, fn func(rs *reservations, now time.Time) (bool, error)) (done bool, err error) {
	var rs reservations
	var rev uint64
	e, err := kvs.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return false, err
	default:
		rev = e.Revision()
		if err := json.Unmarshal(e.Value(), &rs); err != nil {
			// Unreadable reservations would block the tenant for good: start again from none,
			// loudly (the ledger, the truth of what was spent, is untouched).
			b.l.log.Error().Err(err).Str(fieldTenantKey, key).Msg("budget reservations unreadable; replaced")
			rs = reservations{}
		}
	}
	changed, err := fn(&rs, b.now())
	if err != nil || !changed {
		return true, err
	}
	data, err := json.Marshal(&rs)
	if err != nil {
		return true, fmt.Errorf("ledger: budget reservations: %w", err)
	}
	if rev == 0 {
		_, err = kvs.Create(ctx, key, data)
	} else {
		_, err = kvs.Update(ctx, key, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) { // also a failed Update CAS
		return false, nil
	}
	return err == nil, err
}

// fieldTenantKey logs a tenant's reservation key (a hash).
const fieldTenantKey = "budget_key"

// bucket is BudgetBucket, opened (and created) on first use.
func (b *Budgets) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	b.kvMu.Lock()
	defer b.kvMu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kvs, err := openBudgetBucket(ctx, b.l.js, b.replicas)
	if err != nil {
		return nil, err
	}
	b.kv = kvs
	return kvs, nil
}

func (b *Budgets) dropBucket() {
	b.kvMu.Lock()
	b.kv = nil
	b.kvMu.Unlock()
}

// openBudgetBucket opens BudgetBucket, creating it with replicas (0: LEDGER's) or raising an
// existing bucket's replicas to that; it never lowers them. The reservations are in a file
// stream: a server restart must not forget what is in flight.
func openBudgetBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	if replicas <= 0 {
		replicas = 1
		if st, err := js.Stream(ctx, StreamName); err == nil {
			replicas = max(1, st.CachedInfo().Config.Replicas)
		}
	}
	kvs, err := js.KeyValue(ctx, BudgetBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kvs, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: BudgetBucket,
			Description: "oncegate budget reservations in flight, per tenant (the ledger holds what was spent)",
			History:     1, Storage: jetstream.FileStorage, Replicas: replicas})
		if errors.Is(err, jetstream.ErrBucketExists) { // created meanwhile by another node
			kvs, err = js.KeyValue(ctx, BudgetBucket)
		}
	}
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, "KV_"+BudgetBucket)
	if err != nil {
		return nil, err
	}
	if cfg := st.CachedInfo().Config; cfg.Replicas < replicas {
		cfg.Replicas = replicas
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			return nil, err
		}
	}
	return kvs, nil
}
