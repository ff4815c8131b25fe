package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/partition"
)

// Set is the ledger of a store of one or more partitions: one Ledger per partition, each on
// its own stream (LEDGER, LEDGER_P1, ...) with its own chain per tenant. Writers go through
// For (or Charge, Continuation and Reverse, which pick the partition of the entry's key);
// readers (Scan, Entries, Bill, Reconcile, Budgets) read every partition. With one partition
// a Set is its Ledger. A Set is safe for concurrent use.
type Set struct {
	parts []*Ledger // by partition; parts[i].Partition() == i
}

// NewSet is the Set of a store of count partitions (1 when less) on js, every partition's
// Ledger made by New with prices, currency and opts (a WithPartition among them is overridden).
func NewSet(js jetstream.JetStream, prices Prices, currency string, count int, opts ...Option) *Set {
	s := &Set{}
	for _, p := range partition.All(count) {
		s.parts = append(s.parts, New(js, prices, currency, append(slices.Clone(opts), WithPartition(p))...))
	}
	return s
}

// OpenSet is NewSet for the partitions whose ledger streams exist on js (Partitions): for a
// caller that does not know the count, like the ledger commands. Without any ledger stream it
// is the Set of one partition.
func OpenSet(ctx context.Context, js jetstream.JetStream, prices Prices, currency string, opts ...Option) (*Set, error) {
	ps, err := Partitions(ctx, js)
	if err != nil {
		return nil, err
	}
	count := 1
	if len(ps) > 0 {
		count = int(ps[len(ps)-1]) + 1
	}
	return NewSet(js, prices, currency, count, opts...), nil
}

// Partitions lists the partitions whose ledger stream (LEDGER, LEDGER_P<k>) exists on js, in
// order.
func Partitions(ctx context.Context, js jetstream.JetStream) ([]partition.P, error) {
	names := js.StreamNames(ctx)
	var ps []partition.P
	for name := range names.Name() {
		if p, ok := partitionOfStream(name); ok {
			ps = append(ps, p)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("ledger: list streams: %w", err)
	}
	slices.Sort(ps)
	return ps, nil
}

// partitionOfStream is the partition whose ledger stream is name.
func partitionOfStream(name string) (partition.P, bool) {
	if name == StreamName {
		return 0, true
	}
	k, ok := strings.CutPrefix(name, StreamName+"_P")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(k)
	if err != nil || n < 1 || n >= partition.Max || strconv.Itoa(n) != k {
		return 0, false
	}
	return partition.P(n), true
}

// Ledgers are the Set's ledgers, one per partition, in order (do not modify the slice).
func (s *Set) Ledgers() []*Ledger { return s.parts }

// Currency is the currency of the Set's charges.
func (s *Set) Currency() string { return s.parts[0].currency }

// For is the ledger of key's partition (partition.OfKey), or an ErrInvalid when the Set has
// no such partition (a key made for a store of more partitions).
func (s *Set) For(key string) (*Ledger, error) {
	p := partition.OfKey(key)
	if int(p) >= len(s.parts) {
		return nil, fmt.Errorf("%w: key of partition %d in a ledger of %d partitions", ErrInvalid, p, len(s.parts))
	}
	return s.parts[p], nil
}

// keyOfID is the key hash an entry id names (charge.<key hash>.<job id>..., and the same
// after "reversal.").
func keyOfID(id string) string {
	_, rest, _ := strings.Cut(strings.TrimPrefix(id, KindReversal+"."), ".")
	key, _, _ := strings.Cut(rest, ".")
	return key
}

// Charge is Ledger.Charge on the ledger of c.KeyHash's partition.
func (s *Set) Charge(ctx context.Context, c ChargeInput) (Entry, error) {
	l, err := s.For(c.KeyHash)
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: charge: %w", err)
	}
	return l.Charge(ctx, c)
}

// Continuation is Ledger.Continuation on the ledger of the charge's partition.
func (s *Set) Continuation(ctx context.Context, chargeID string, c ChargeInput) (Entry, error) {
	l, err := s.For(keyOfID(chargeID))
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: continuation of %s: %w", chargeID, err)
	}
	return l.Continuation(ctx, chargeID, c)
}

// Reverse is Ledger.Reverse on the ledger of the entry's partition.
func (s *Set) Reverse(ctx context.Context, id, reason string) (Entry, error) {
	l, err := s.For(keyOfID(id))
	if err != nil {
		return Entry{}, fmt.Errorf("ledger: reverse %s: %w", id, err)
	}
	return l.Reverse(ctx, id, reason)
}

// Scan is Ledger.Scan over every partition, one after the other (partition 0 first), each in
// its stream order: a tenant's entries of one partition come in their chain's order.
func (s *Set) Scan(ctx context.Context, tenant string, from, to time.Time, fn func(Entry) error) error {
	for _, l := range s.parts {
		if err := l.Scan(ctx, tenant, from, to, fn); err != nil {
			return err
		}
	}
	return nil
}

// Entries is Ledger.Entries over every partition, in Scan's order.
func (s *Set) Entries(ctx context.Context, tenant string, from, to time.Time) ([]Entry, error) {
	return entriesOf(ctx, s.Scan, tenant, from, to)
}

// Bill is Ledger.Bill over every partition: the entries of all of them, and the tally
// reports (one stream for the store) once.
func (s *Set) Bill(ctx context.Context, tenant string, from, to time.Time) (*Bill, error) {
	return billOf(ctx, s.parts, tenant, from, to)
}

// Reconcile runs Ledger.Reconcile on every partition (an intent and all its charges live in
// one partition, so each finds its own duplicates) and sums their reports; Partitions holds
// each one's. A partition whose run fails does not stop the others: the error joins theirs.
func (s *Set) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var sum ReconcileReport
	var errs []error
	for _, l := range s.parts {
		rep, err := l.Reconcile(ctx)
		rep.Partition = int(l.part)
		if err != nil {
			errs = append(errs, fmt.Errorf("partition %d: %w", l.part, err))
		}
		sum.Entries += rep.Entries
		sum.Intents += rep.Intents
		sum.Duplicates = append(sum.Duplicates, rep.Duplicates...)
		sum.Appended = append(sum.Appended, rep.Appended...)
		sum.AlreadyThere += rep.AlreadyThere
		sum.ReversedMicros += rep.ReversedMicros
		sum.RepeatedIDs = append(sum.RepeatedIDs, rep.RepeatedIDs...)
		sum.ForgottenEarly += rep.ForgottenEarly
		sum.Partitions = append(sum.Partitions, rep)
	}
	return sum, errors.Join(errs...)
}

// Budgets is NewBudgets over every partition of the Set: a tenant's spend is the sum of its
// entries in all of them.
func (s *Set) Budgets(period Period, limits map[string]int64, opts ...BudgetOption) (*Budgets, error) {
	return newBudgets(s, period, limits, opts...)
}

// TenantBudgets is NewTenantBudgets over every partition of the Set.
func (s *Set) TenantBudgets(limits map[string]BudgetLimit) (TenantBudgets, error) {
	return tenantBudgets(s, limits)
}

// ServeAppends runs Ledger.ServeAppends for every partition until ctx ends (a partition's
// appends are served where its stream's leader is).
func (s *Set) ServeAppends(ctx context.Context) error {
	errs := make([]error, len(s.parts))
	var wg sync.WaitGroup
	for i, l := range s.parts {
		wg.Go(func() { errs[i] = l.ServeAppends(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
