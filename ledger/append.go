package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/oncegate/oncegate/internal/jspub"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/partition"
)

// Appends are committed in groups, one tenant's chain at a time.
//
// Every entry hashes its predecessor, and JetStream stores it only while the chain's head is
// still the last entry on the tenant's subject; so one tenant's appends go one after the
// other. Published one by one, each waits for a synced (on a cluster, replicated) write, and
// that bounds a tenant's charges per second: row 18's soak queued worker slots on the chain
// lock at 20 intents/s. So an append waits in its chain's queue, and whoever holds the chain
// lock commits everything queued as one atomic batch (NATS 2.12+): one round trip and one
// commit for up to maxBatch entries, all stored or none. A single-replica LEDGER, a stream
// that does not allow atomic publishes, or a batch NATS refuses for a reason other than a
// moved head, gets them one by one as before (atomicBatches says why not on one replica).

// maxBatch bounds the entries of one atomic batch (the server's limit is 1,000).
const maxBatch = 64

// maxAppendTries bounds how often one group re-reads its chain after losing a race.
const maxAppendTries = 1000

// errCodeAtomicDisabled is the refusal of a batch by a stream that does not allow atomic
// publishes (nats.go has no constant for it).
const errCodeAtomicDisabled jetstream.ErrorCode = 10174

// pending is one append waiting in its chain's queue. The committer finishes it once.
type pending struct {
	e        Entry
	d        idDigest
	expect   func(context.Context) error
	deadline time.Time // the caller's; zero: none
	// twins are later appends of the same id in the same group: they get this one's outcome.
	twins []*pending
	done  chan struct{}

	out     Entry
	created bool
	err     error
}

func (p *pending) finish(out Entry, created bool, err error) {
	p.out, p.created, p.err = out, created, err
	close(p.done)
	for _, t := range p.twins {
		t.finish(out, false, err)
	}
}

func (p *pending) fail(err error) {
	p.finish(Entry{}, false, fmt.Errorf("ledger: append %s: %w", p.e.ID, err))
}

func (c *chain) enqueue(p *pending) {
	c.qmu.Lock()
	c.queue = append(c.queue, p)
	c.qmu.Unlock()
}

// take removes and returns the first n appends of the queue.
func (c *chain) take(n int) []*pending {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	n = min(n, len(c.queue))
	group := slices.Clone(c.queue[:n])
	c.queue = slices.Delete(c.queue, 0, n)
	return group
}

// withdraw removes p from the queue; false if a committer took it already.
func (c *chain) withdraw(p *pending) bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	i := slices.Index(c.queue, p)
	if i < 0 {
		return false
	}
	c.queue = slices.Delete(c.queue, i, i+1)
	return true
}

// append writes e at the head of its tenant's chain, or returns the stored entry with e's id;
// created reports whether e was written now. expect, when set, is called before each publish;
// after, when set, says e may repeat an entry stored since then (ChargeInput.After).
// An append whose context ends while it waits in the queue is withdrawn; once taken into a
// group it is committed or refused with the group, within the latest deadline of its members.
// Without a fence check it goes to the stream leader's appender first (forward.go).
func (l *Ledger) append(ctx context.Context, e Entry, expect func(context.Context) error, after time.Time) (Entry, bool, error) {
	if expect == nil && l.forwards() && partition.OfKey(e.KeyHash) == l.part {
		if out, created, ok := l.forward(ctx, e, after); ok {
			return out, created, nil
		}
	}
	return l.appendHere(ctx, e, expect, after)
}

// appendHere is append by this process: its chain's queue, its publish.
func (l *Ledger) appendHere(ctx context.Context, e Entry, expect func(context.Context) error, after time.Time) (Entry, bool, error) {
	if p := partition.OfKey(e.KeyHash); p != l.part {
		return Entry{}, false, fmt.Errorf("ledger: append %s: %w: key of partition %d, ledger of partition %d", e.ID, ErrInvalid, p, l.part)
	}
	c := l.chain(e.Tenant)
	if !after.IsZero() {
		// A possible repeat of an entry older than the index: looked up before queueing, so
		// that its read of the stream holds up nobody.
		seq, ok, err := c.lookup(ctx, l, e.ID, after)
		if err != nil {
			return Entry{}, false, fmt.Errorf("ledger: append %s: %w", e.ID, err)
		}
		if ok {
			prev, err := l.storedAs(ctx, seq, &e)
			if err != nil {
				return Entry{}, false, fmt.Errorf("ledger: append %s: %w", e.ID, err)
			}
			return prev, false, nil
		}
	}
	p := &pending{e: e, d: digest(e.ID), expect: expect, done: make(chan struct{})}
	p.deadline, _ = ctx.Deadline()
	c.enqueue(p)
	for {
		select {
		case <-p.done:
			return p.out, p.created, p.err
		case c.mu <- struct{}{}:
			select {
			case <-p.done: // the lock's previous holder committed it
			default:
				l.commitQueued(ctx, c)
			}
			c.mu.Unlock()
		case <-ctx.Done():
			if c.withdraw(p) {
				return Entry{}, false, fmt.Errorf("ledger: append %s: %w", e.ID, ctx.Err())
			}
			<-p.done
			return p.out, p.created, p.err
		}
	}
}

// commitQueued commits the appends at the head of c's queue. The caller holds c.mu.
func (l *Ledger) commitQueued(ctx context.Context, c *chain) {
	group := c.take(maxBatch)
	if len(group) == 0 {
		return
	}
	// The group is the members' work, not only the caller's: it ends with the last deadline.
	gctx := context.WithoutCancel(ctx)
	last, bounded := time.Time{}, true
	for _, p := range group {
		bounded = bounded && !p.deadline.IsZero()
		if p.deadline.After(last) {
			last = p.deadline
		}
	}
	if bounded {
		var cancel context.CancelFunc
		gctx, cancel = context.WithDeadline(gctx, last)
		defer cancel()
	}
	l.commit(gctx, c, group)
}

// commit appends group's entries to c and finishes every one of them.
func (l *Ledger) commit(ctx context.Context, c *chain, group []*pending) {
	failAll := func(ps []*pending, err error) {
		for _, p := range ps {
			p.fail(err)
		}
	}
	if !c.loaded {
		if err := c.sync(ctx, l, 0); err != nil {
			failAll(group, err)
			return
		}
	}
	todo := l.resolve(ctx, c, group)
	oneByOne := !l.atomicBatches(ctx)
	for try := 0; len(todo) > 0; try++ {
		if try == maxAppendTries {
			failAll(todo, ErrContended)
			return
		}
		todo = fenced(ctx, todo)
		if len(todo) == 0 {
			return
		}
		// A publish that fails as an election makes it fail (a timeout, no responders, no
		// leader) is sent again, the same entries under the same
		// expected head: one that was stored after all is refused as a stale head (or as a
		// duplicate id), and the chain is re-read below, so a retry never stores an entry twice.
		// It is retried for as long as the group's latest deadline allows, jsretry's window at
		// least.
		until := time.Now().Add(jsretry.Window)
		if d, ok := ctx.Deadline(); ok && d.After(until) {
			until = d
		}
		var err error
		if oneByOne || len(todo) == 1 {
			if err = jsretry.Do(ctx, until, func(ctx context.Context) error { return l.publishOne(ctx, c, todo[0]) }); err == nil {
				todo = todo[1:]
			}
		} else if err = jsretry.Do(ctx, until, func(ctx context.Context) error { return l.publishBatch(ctx, c, todo) }); err == nil {
			todo = nil
		}
		var apiErr *jetstream.APIError
		switch {
		case err == nil:
		case errors.Is(err, jsretry.ErrUnavailable): // the window passed without a leader
			failAll(todo, err)
			return
		case wrongLast(err):
			l.refused.Add(1)
			if serr := c.sync(ctx, l, headIn(err)); serr != nil {
				failAll(todo, serr)
				return
			}
			todo = l.resolve(ctx, c, todo)
		case !oneByOne && errors.As(err, &apiErr):
			// Refused as a whole (an id stored before, a server limit, atomic publishes off):
			// the one-by-one path handles each entry's case.
			if apiErr.ErrorCode == errCodeAtomicDisabled {
				l.noAtomic.Store(true)
			}
			l.log.Debug().Err(err).Int("entries", len(todo)).Msg("ledger batch refused; appending one by one")
			oneByOne = true
		default:
			// The publish may have been stored all the same; the next append finds out (its
			// expected sequence is stale, so it re-reads the chain first).
			failAll(todo, err)
			return
		}
	}
}

// resolve finishes the appends whose id the chain holds already (with the stored entry) and
// returns the others, one per id: a second append of an id in the group gets the first's
// outcome. (An append that may repeat an entry older than the index looked it up in the
// stream before it queued.)
func (l *Ledger) resolve(ctx context.Context, c *chain, ps []*pending) []*pending {
	todo := make([]*pending, 0, len(ps))
	var firsts map[idDigest]*pending
	for _, p := range ps {
		if first := firsts[p.d]; first != nil {
			first.twins = append(first.twins, p)
			continue
		}
		if seq, ok := c.ids[p.d]; ok {
			prev, err := l.storedAs(ctx, seq, &p.e)
			if err != nil {
				p.fail(err)
			} else {
				p.finish(prev, false, nil)
			}
			continue
		}
		if firsts == nil {
			firsts = map[idDigest]*pending{}
		}
		firsts[p.d] = p
		todo = append(todo, p)
	}
	return todo
}

// storedAs reads the entry at seq, which the index says holds e's id.
func (l *Ledger) storedAs(ctx context.Context, seq uint64, e *Entry) (Entry, error) {
	prev, err := l.entryAt(ctx, seq)
	if err != nil {
		return Entry{}, err
	}
	if prev.ID != e.ID {
		return Entry{}, fmt.Errorf("%w: seq %d holds %s", ErrCorrupt, seq, prev.ID)
	}
	if prev.CostMicros != e.CostMicros || prev.InputTokens != e.InputTokens || prev.OutputTokens != e.OutputTokens {
		l.log.Warn().Str(fieldEntryID, e.ID).Uint64(fieldSeq, seq).Int64(fieldCost, prev.CostMicros).
			Msg("entry exists with other usage; the stored entry stands")
	}
	return prev, nil
}

// fenced finishes the appends whose writer's fence check refuses, and returns the others.
func fenced(ctx context.Context, ps []*pending) []*pending {
	return slices.DeleteFunc(ps, func(p *pending) bool {
		if p.expect == nil {
			return false
		}
		if err := p.expect(ctx); err != nil {
			p.fail(fmt.Errorf("%w: %w", ErrFenced, err))
			return true
		}
		return false
	})
}

// atomicBatches reports whether LEDGER's appends go in atomic batches: the stream is
// replicated and allows them (a server before 2.12 does not know the setting and never reports
// it), and none was refused as disabled. A single replica stages every batch in a file store
// of its own (a directory, files and an fsync per batch, nats-server's newBatchStore), which
// measured no faster than one synced publish per entry (BENCHMARKS.md); replicas stage it in
// memory and the batch is one replicated commit.
func (l *Ledger) atomicBatches(ctx context.Context) bool {
	if l.noAtomic.Load() {
		return false
	}
	st, err := l.stream(ctx)
	if err != nil || st == nil {
		return false
	}
	cfg := st.CachedInfo().Config
	return cfg.AllowAtomicPublish && cfg.Replicas > 1
}

// appended records e, stored now at e.Seq, as c's head.
func (l *Ledger) appended(c *chain, p *pending) {
	e := &p.e
	c.remember(p.d, e.Seq, e.Time)
	c.lastSeq, c.lastHash = e.Seq, e.Hash
	l.log.Debug().Str(fieldEntryID, e.ID).Str(fieldKind, e.Kind).Str(fieldTenant, e.Tenant).
		Uint64(fieldSeq, e.Seq).Int64(fieldCost, e.CostMicros).Msg("ledger entry appended")
	l.counted(e)
	p.finish(*e, true, nil)
}

// publishOne appends p's entry alone. An error is the publish's (p is not finished); any
// other outcome finishes p.
func (l *Ledger) publishOne(ctx context.Context, c *chain, p *pending) error {
	e := &p.e
	e.PrevHash = c.lastHash
	e.Hash = l.hashOf(e)
	msg := nats.NewMsg(c.subject)
	msg.Data = encodeStored(e)
	msg.Header.Set(jetstream.MsgIDHeader, e.ID)
	msg.Header.Set(jetstream.ExpectedStreamHeader, l.streamName)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(c.lastSeq, 10))
	ack, err := jspub.Publish(ctx, l.js.Conn(), msg)
	switch {
	case err != nil:
		return err
	case !ack.Duplicate:
		e.Seq = ack.Sequence
		l.appended(c, p)
	default:
		// In the Nats-Msg-Id window although our head was current: the entry is older than
		// the dedup horizon, or (a misuse) the id is taken on another tenant's subject.
		prev, err := l.entryAt(ctx, ack.Sequence)
		switch {
		case err != nil:
			p.fail(err)
		case prev.ID != e.ID || prev.Tenant != e.Tenant:
			p.fail(fmt.Errorf("%w: the id is taken by seq %d of another tenant", ErrInvalid, ack.Sequence))
		default:
			c.remember(p.d, prev.Seq, prev.Time)
			p.finish(prev, false, nil)
		}
	}
	return nil
}

// publishBatch appends the entries of ps, chained in order, as one atomic batch: all are
// stored, in consecutive sequences, or none. Only the first message expects the head; the
// others follow it inside the batch. On an error no entry is finished.
func (l *Ledger) publishBatch(ctx context.Context, c *chain, ps []*pending) error {
	msgs := make([]*nats.Msg, len(ps))
	prevHash := c.lastHash
	for i, p := range ps {
		e := &p.e
		e.PrevHash = prevHash
		e.Hash = l.hashOf(e)
		prevHash = e.Hash
		h := nats.Header{}
		h.Set(jetstream.MsgIDHeader, e.ID)
		h.Set(jetstream.ExpectedStreamHeader, l.streamName)
		if i == 0 {
			h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(c.lastSeq, 10))
		}
		msgs[i] = &nats.Msg{Subject: c.subject, Data: encodeStored(e), Header: h}
	}
	ack, err := jetstreamext.PublishMsgBatch(ctx, l.js, msgs, jetstreamext.BatchFlowControl{})
	if err != nil {
		return err
	}
	first := ack.Sequence - uint64(len(ps)) + 1
	for i, p := range ps {
		p.e.Seq = first + uint64(i)
		l.appended(c, p)
	}
	l.batches.Add(1)
	return nil
}
