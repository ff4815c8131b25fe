package kv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeaseWatch finds the PENDING records whose lease ran out without reading the whole bucket
// each time. Its first Expired reads the last record of every key; later calls read only the
// records written since (headers only, from the stream sequence it reached) and keep the
// PENDING keys and their leases in memory. A sweep then costs what was written since the last
// one, not one read of every key of the last TTL (which, at 1,000 requests a second and a 24 h
// TTL, is tens of millions of records, with their blocks loaded into the server's cache). If the
// stream is found behind the sequence reached (the bucket was recreated; asked after a failed
// read), the next call reads every key again. Safe for concurrent use; calls are serialized.
type LeaseWatch struct {
	s *Store

	mu        sync.Mutex
	started   bool                 // the first full read completed
	lastSeq   uint64               // the stream sequence read up to
	pending   map[string]pendingAt // PENDING keys: their lease, and when the record was written
	readCount int                  // records read by the last call (tests)
	cons      jetstream.Consumer   // kept across calls (see consumer); nil: create it
	consSeq   uint64               // the last consumer sequence applied from cons
	// st is the bucket's stream as last asked; recheck says to ask again (the first call, and
	// after a failed read) whether the stream is behind the sequence reached.
	st      jetstream.Stream
	recheck bool
	// billable are the finished records with something to charge seen since the last
	// Billable call took them (see Billable); billSince bounds the first read's.
	billable  map[string]Finished
	billSince time.Time
	// billDropped counts billable records not kept because billable was full.
	billDropped int
}

type pendingAt struct {
	lease, written time.Time
	worker         string // the pool the record names (Record.Worker); "" if none
}

// WatchLeases returns a LeaseWatch on the bucket.
func (s *Store) WatchLeases() *LeaseWatch {
	return &LeaseWatch{s: s, pending: map[string]pendingAt{}, billable: map[string]Finished{}, recheck: true}
}

// kvOperation is the header a KV delete or purge marker carries.
const kvOperation = "KV-Operation"

// leaseConsumerIdle is how long the watch's consumer outlives its last read: longer than any
// sane sweep interval, so it is created once per process; past it the server deletes it and
// the next read creates it again (from where the watch stopped).
const leaseConsumerIdle = 5 * time.Minute

// maxLeaseResets bounds the consumers one read replaces after gaps before it gives up (the
// next sweep goes on from the sequence reached).
const maxLeaseResets = 3

// Expired lists the keys whose latest record is PENDING with a lease before now, oldest lease
// first.
func (w *LeaseWatch) Expired(ctx context.Context, now time.Time) ([]Expired, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	// The stream is asked for only when a read failed: a recreated bucket deletes the
	// consumer with the old stream, so the next read fails, and the call after it finds the
	// stream behind. A stream info per sweep was a third of an idle cluster's JetStream
	// requests (issue 44).
	if w.recheck || w.st == nil {
		st, err := w.s.js.Stream(ctx, w.s.names.stream)
		if err != nil {
			return nil, fmt.Errorf("kv: lease scan: %w", err)
		}
		if last := st.CachedInfo().State.LastSeq; last < w.lastSeq {
			w.dropConsumer(ctx)
			w.started, w.lastSeq, w.pending = false, 0, map[string]pendingAt{}
		}
		w.st, w.recheck = st, false
	}
	if !w.started {
		w.billSince = now.Add(-BillableWindow)
	}
	if err := w.read(ctx, w.st); err != nil {
		w.recheck = true
		return nil, err
	}
	w.started = true
	var out []Expired
	for key, p := range w.pending {
		switch {
		case w.s.ttl > 0 && now.After(p.written.Add(w.s.ttl)):
			delete(w.pending, key) // past the bucket's TTL: dropped by the server, unseen here
		case now.After(p.lease):
			out = append(out, Expired{Key: key, LeaseUntil: p.lease})
		}
	}
	slices.SortFunc(out, func(a, b Expired) int {
		return cmp.Or(a.LeaseUntil.Compare(b.LeaseUntil), strings.Compare(a.Key, b.Key))
	})
	return out, nil
}

// Owned is a PENDING record whose lease still runs and which names its worker pool.
type Owned struct {
	Key, Worker string
}

// Owned lists the PENDING records that name a worker and whose lease runs past now, as the
// last Expired read found them (it reads nothing itself), by key.
func (w *LeaseWatch) Owned(now time.Time) []Owned {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Owned
	for key, p := range w.pending {
		if p.worker != "" && !now.After(p.lease) {
			out = append(out, Owned{Key: key, Worker: p.worker})
		}
	}
	slices.SortFunc(out, func(a, b Owned) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Close deletes the watch's consumer (else the server does once it has been idle for
// leaseConsumerIdle).
func (w *LeaseWatch) Close(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dropConsumer(ctx)
}

// consumer is the watch's consumer on st: one for the life of the watch, not one per read.
// Creating a consumer on the bucket costs one pass over every key's subject state in the
// server (its pending count, on a stream keeping one message per subject), so a consumer per
// read, as an ordered consumer does on each fetch, made every sweep cost the whole TTL's keys
// again. The first is delivered the last record of every key, later ones start after the
// sequence the watch reached.
func (w *LeaseWatch) consumer(ctx context.Context, st jetstream.Stream) (jetstream.Consumer, error) {
	if w.cons != nil {
		return w.cons, nil
	}
	cfg := jetstream.ConsumerConfig{FilterSubject: w.s.names.subjects + ">", HeadersOnly: true,
		AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: leaseConsumerIdle, MemoryStorage: true, Replicas: 1}
	if w.started {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, w.lastSeq+1
	} else {
		cfg.DeliverPolicy = jetstream.DeliverLastPerSubjectPolicy
	}
	cons, err := st.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	w.cons, w.consSeq = cons, 0
	return cons, nil
}

// dropConsumer deletes the consumer; the next read creates one from the sequence reached.
func (w *LeaseWatch) dropConsumer(ctx context.Context) {
	if w.cons == nil {
		return
	}
	if info := w.cons.CachedInfo(); info != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = w.s.js.DeleteConsumer(dctx, w.s.names.stream, info.Name)
		cancel()
	}
	w.cons = nil
}

// read applies the records the consumer delivers, up to the end of the stream, to w.pending.
// In both delivery policies the sequences arrive in increasing order, so w.lastSeq is exact
// even when a read stops half way: a key's later record is past it and read next time. The
// consumer does not ack, so a delivery lost on the way (a fetch cut short) shows as a gap in
// the consumer sequence: the consumer is then replaced by one starting after the last record
// applied.
func (w *LeaseWatch) read(ctx context.Context, st jetstream.Stream) error {
	w.readCount = 0
	for resets := 0; ; {
		cons, err := w.consumer(ctx, st)
		if err != nil {
			return fmt.Errorf("kv: lease scan: %w", err)
		}
		batch, err := cons.FetchNoWait(1024)
		if err != nil {
			w.dropConsumer(ctx)
			return fmt.Errorf("kv: lease scan: %w", err)
		}
		n, gap := 0, false
		var pending uint64
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if gap || err != nil || md.Sequence.Consumer != w.consSeq+1 {
				gap = true // drain the batch, apply nothing more
				continue
			}
			n++
			w.consSeq, pending = md.Sequence.Consumer, md.NumPending
			if md.Sequence.Stream > w.lastSeq {
				w.lastSeq = md.Sequence.Stream
			}
			w.apply(strings.TrimPrefix(m.Subject(), w.s.names.subjects), m.Headers(), md.Timestamp, md.Sequence.Stream)
		}
		w.readCount += n
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			w.dropConsumer(ctx)
			return fmt.Errorf("kv: lease scan: %w", err)
		}
		if gap {
			w.dropConsumer(ctx)
			w.started = w.started || w.lastSeq > 0
			if resets++; resets > maxLeaseResets {
				return fmt.Errorf("kv: lease scan: deliveries keep going missing (%d consumers replaced)", resets)
			}
			continue
		}
		if n == 0 || pending == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// apply records a key's latest record: PENDING with its lease, or anything else (a final
// state, a delete or purge marker, a job index entry) as not pending.
func (w *LeaseWatch) apply(key string, h nats.Header, written time.Time, rev uint64) {
	if h.Get(hdrBill) != "" && h.Get(kvOperation) == "" {
		w.noteBillable(key, written, rev, h.Get(hdrWorker))
	}
	if h.Get(kvOperation) != "" || h.Get(hdrState) != string(Pending) {
		delete(w.pending, key)
		return
	}
	ms, err := strconv.ParseInt(h.Get(hdrLease), 10, 64)
	if err != nil {
		delete(w.pending, key)
		return
	}
	w.pending[key] = pendingAt{lease: time.UnixMilli(ms), written: written, worker: h.Get(hdrWorker)}
}
