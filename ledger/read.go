package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsdirect"
	"github.com/oncegate/oncegate/internal/jsleader"
	"github.com/oncegate/oncegate/internal/jsretry"
)

// scanBatch is how many messages a scan keeps in flight.
const scanBatch = 4096

// scanHeartbeat is how often the server tells a scan's consumer that it is alive.
const scanHeartbeat = 2 * time.Second

// followBatch is how many entries one of follow's direct gets returns.
const followBatch = 256

// followMax is how many entries follow reads by message gets before it switches to a scan. A scan
// makes an ordered consumer, on a cluster a meta-group change that took seconds under load:
// with 64, a chain three nodes append to fell that far behind at c=16, its scans held every
// charge, and the unacked jobs filled the workers' consumer (stalls of 4-8 s; issue 44). A
// message get is one leader round trip, under a millisecond.
const followMax = 1024

// entryAt reads the entry stored at seq from LEDGER's leader, riding out an election
// (jsretry: a read is the same read each time). Row 3a's long run saw 22 charges fail on one
// such read, the chain's re-read after a stale head, while LEDGER had no leader. The leader,
// not any replica: the sequence may be one the stream acknowledged a moment ago.
func (l *Ledger) entryAt(ctx context.Context, seq uint64) (Entry, error) {
	st, err := l.stream(ctx)
	if err != nil {
		return Entry{}, err
	}
	if st == nil {
		return Entry{}, fmt.Errorf("ledger: read seq %d: %w", seq, ErrNotFound)
	}
	m, err := l.leaderGet(ctx, st, jsleader.Request{Seq: seq})
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Entry{}, fmt.Errorf("ledger: read seq %d: %w", seq, ErrNotFound)
		}
		return Entry{}, fmt.Errorf("ledger: read seq %d: %w", seq, err)
	}
	return decodeStored(m.Data, m.Seq)
}

// leaderGet reads req from st's leader (jsleader), riding out an election. LEDGER allows
// direct gets (follow's batches), which nats.go's Stream.GetMsg would send to any replica;
// the reads that must see every acknowledged write ask the leader here.
func (l *Ledger) leaderGet(ctx context.Context, st jetstream.Stream, req jsleader.Request) (*jsleader.Msg, error) {
	var m *jsleader.Msg
	err := jsretry.Within(ctx, func(ctx context.Context) (err error) {
		m, err = jsleader.Get(ctx, l.js.Conn(), jsleader.APIPrefix(l.js), st.CachedInfo().Config.Name, req)
		return err
	})
	return m, err
}

// last is the sequence and store time of the last message on subject (a filter of the whole
// stream, ending in ">": of the stream); seq 0 if there is none.
func (l *Ledger) last(ctx context.Context, st jetstream.Stream, subject string) (uint64, time.Time, error) {
	if strings.HasSuffix(subject, ">") {
		var info *jetstream.StreamInfo
		err := jsretry.Within(ctx, func(ctx context.Context) (err error) {
			info, err = st.Info(ctx)
			return err
		})
		if err != nil {
			return 0, time.Time{}, fmt.Errorf("ledger: stream info: %w", err)
		}
		if info.State.Msgs == 0 {
			return 0, time.Time{}, nil
		}
		return info.State.LastSeq, info.State.LastTime, nil
	}
	m, err := l.leaderGet(ctx, st, jsleader.Request{LastBySubject: subject})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("ledger: last entry of %s: %w", subject, err)
	}
	return m.Seq, m.Time, nil
}

// span bounds a scan: from sequence start, or from the first message the stream stored at or
// after since (the server's clock; for bounding work, never for deciding what an entry is),
// up to sequence end (0: the subject's last message when the scan starts).
type span struct {
	start uint64
	since time.Time
	end   uint64
}

// scan calls fn for every entry on subject (a tenant subject or l.all) in sp, in order.
// It reads with one ordered consumer and stops at the last sequence it was asked for, so
// entries appended meanwhile do not make it run forever. fn's error stops the scan and is
// returned.
func (l *Ledger) scan(ctx context.Context, subject string, sp span, fn func(*Entry) error) error {
	l.scans.Add(1)
	st, err := l.stream(ctx)
	if err != nil || st == nil {
		return err
	}
	return l.scanStream(ctx, st, subject, sp, func(data []byte, seq uint64) error {
		e, err := decodeStored(data, seq)
		if err != nil {
			return err
		}
		return fn(&e)
	})
}

// scanStream calls fn with the data and sequence of every message on subject of st in sp, in
// order (scan's reader, for any stream whose subjects end in ".>" like LEDGER's and
// OG_TALLY's: the whole stream is read through its Info).
func (l *Ledger) scanStream(ctx context.Context, st jetstream.Stream, subject string, sp span, fn func(data []byte, seq uint64) error) error {
	target, lastTime, err := l.last(ctx, st, subject)
	if err != nil {
		return err
	}
	if sp.end != 0 && sp.end < target {
		target = sp.end
	}
	start := max(sp.start, 1)
	if target < start || target == 0 {
		return nil
	}
	if sp.since.IsZero() && target-start < smallScan {
		return l.scanByGet(ctx, st, subject, start, target, fn)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, InactiveThreshold: 30 * time.Second}
	switch {
	case !sp.since.IsZero():
		if lastTime.Before(sp.since) {
			return nil // nothing stored since: the consumer would deliver nothing
		}
		since := sp.since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	case start > 1:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	cons, err := st.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("ledger: read %s: %w", subject, err)
	}
	// The heartbeat makes the ordered consumer notice a consumer lost with its server (an
	// election) within two of them and recreate it; without it (nats.go's default is
	// half the 30 s pull expiry) a scan stalled for its caller's whole deadline.
	it, err := cons.Messages(jetstream.PullMaxMessages(scanBatch), jetstream.PullHeartbeat(scanHeartbeat))
	if err != nil {
		return fmt.Errorf("ledger: read %s: %w", subject, err)
	}
	// Next's context does not reach nats.go's re-making of a lost consumer, which retries
	// without end while the stream has no leader: a node whose cluster stopped first hung in
	// its shutdown's reconcile for 20 minutes (bench/results/i44/round13). Stopping the
	// iterator ends those retries; Next's context ends the wait on a pull made just after
	// (cold/apply.go says more).
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer func() {
		it.Stop()
		// Do not leave the ephemeral consumer to its inactivity timeout.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			_ = st.DeleteConsumer(dctx, info.Name)
			cancel()
		}
	}()
	behind := false // the last message said nothing was pending short of the target
	for {
		nctx, cancel := ctx, context.CancelFunc(func() {})
		if behind {
			nctx, cancel = context.WithTimeout(ctx, scanCatchUp)
		}
		m, err := it.Next(jetstream.NextContext(nctx))
		cancel()
		if err != nil {
			if behind && ctx.Err() == nil {
				return fmt.Errorf("ledger: read %s: %w (the consumer's replica stayed short of sequence %d)", subject, ErrReplicaBehind, target)
			}
			return fmt.Errorf("ledger: read %s: %w", subject, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("ledger: read %s: %w", subject, err)
		}
		seq := md.Sequence.Stream
		if seq > target {
			return nil // the subject had nothing more up to the target (a bounded scan)
		}
		if err := fn(m.Data(), seq); err != nil {
			return err
		}
		if seq >= target {
			return nil
		}
		// NumPending 0 short of the target is not the end: NATS places a one-replica consumer
		// on any current replica of the stream, and one still catching up (a node restarted a
		// moment ago) counts only what it holds. Stopping there returned part of the stream as
		// the whole (suspected in TestDeployedRow: an export after a node's restart listed 106
		// entries for some 230 charged jobs). Next waits for the rest while the replica catches
		// up, at most scanCatchUp per message; then the scan fails rather than end short.
		behind = md.NumPending == 0
	}
}

// scanCatchUp bounds the wait for the next message of a scan whose consumer said nothing was
// pending short of the target (scanStream).
const scanCatchUp = 10 * time.Second

// ErrReplicaBehind: a scan's consumer stopped short of the stream's last message (a replica
// catching up); the caller retries the read.
var ErrReplicaBehind = errors.New("ledger: a replica behind the stream")

// smallScan is the most sequences a scan reads one message get at a time instead of through
// an ordered consumer: on a cluster a consumer is a meta-group change on every server, which
// a reconcile of the few entries a quiet minute added should not cost (issue 44).
const smallScan = 32

// scanByGet is scanStream's read of sequences start to target one message get each, keeping
// those on subject (a literal subject, or a prefix ending in ".>").
func (l *Ledger) scanByGet(ctx context.Context, st jetstream.Stream, subject string, start, target uint64, fn func(data []byte, seq uint64) error) error {
	prefix, wild := strings.CutSuffix(subject, ">")
	for seq := start; seq <= target; seq++ {
		m, err := l.leaderGet(ctx, st, jsleader.Request{Seq: seq})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // deleted, or a gap
		}
		if err != nil {
			return fmt.Errorf("ledger: read %s: %w", subject, err)
		}
		if m.Subject != subject && (!wild || !strings.HasPrefix(m.Subject, prefix)) {
			continue
		}
		if err := fn(m.Data, m.Seq); err != nil {
			return err
		}
	}
	return nil
}

// follow calls fn for the entries on subject from sequence start on, up to the last the
// leader holds, or, when upTo is non-zero, up to upTo at least (a head the caller knows exists):
// batched direct gets first, answered by this server's replica without Raft or a route hop
// (on a cluster, the leader message gets one per entry that follow made before were most of the
// JetStream requests of an intent: issue 44), then message gets from the leader past what the
// replica held, which may be behind by the last few writes. Past followMax entries it scans.
// For catching up with a few new entries.
func (l *Ledger) follow(ctx context.Context, subject string, start, upTo uint64, fn func(*Entry) error) error {
	st, err := l.stream(ctx)
	if err != nil || st == nil {
		return err
	}
	each := func(data []byte, seq uint64) error {
		e, err := decodeStored(data, seq)
		if err != nil {
			return err
		}
		start = seq + 1
		return fn(&e)
	}
	read := 0
	for full := st.CachedInfo().Config.AllowDirect; full; {
		var msgs []jsdirect.Msg
		err := jsretry.Within(ctx, func(ctx context.Context) (err error) {
			msgs, full, err = jsdirect.Batch(ctx, l.js.Conn(), jsleader.APIPrefix(l.js), l.streamName, subject, start, followBatch)
			return err
		})
		if err != nil {
			return fmt.Errorf("ledger: read %s from %d: %w", subject, start, err)
		}
		for _, m := range msgs {
			if err := each(m.Data, m.Seq); err != nil {
				return err
			}
		}
		if read += len(msgs); read >= followMax {
			return l.scan(ctx, subject, span{start: start}, fn)
		}
	}
	for ; read < followMax; read++ {
		if upTo != 0 && start > upTo {
			return nil
		}
		m, err := l.leaderGet(ctx, st, jsleader.Request{Seq: start, NextBySubject: subject})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("ledger: read %s from %d: %w", subject, start, err)
		}
		if err := each(m.Data, m.Seq); err != nil {
			return err
		}
	}
	return l.scan(ctx, subject, span{start: start}, fn)
}

// Scan calls fn, in stream order, for every entry of tenant ("" = every tenant) whose Time is
// in [from, to) (a zero from or to leaves that side open). It reads the tenant's whole subject
// (or the whole stream) and filters on Entry.Time, the appender's clock: no assumption about
// the server's clock, at the price of a read that grows with the ledger, not the period.
// fn's error stops the scan and is returned.
func (l *Ledger) Scan(ctx context.Context, tenant string, from, to time.Time, fn func(Entry) error) error {
	subject := l.all
	if tenant != "" {
		subject = l.subject(tenant)
	}
	return l.scan(ctx, subject, span{}, func(e *Entry) error {
		if tenant != "" && e.Tenant != tenant {
			return fmt.Errorf("%w: seq %d on the subject of another tenant", ErrCorrupt, e.Seq)
		}
		if (!from.IsZero() && e.Time.Before(from)) || (!to.IsZero() && !e.Time.Before(to)) {
			return nil
		}
		return fn(*e)
	})
}

// Entries returns the entries of tenant ("" = every tenant) whose Time is in [from, to) (zero:
// open), in stream order.
func (l *Ledger) Entries(ctx context.Context, tenant string, from, to time.Time) ([]Entry, error) {
	return entriesOf(ctx, l.Scan, tenant, from, to)
}

// entriesOf collects what scan (Ledger.Scan, Set.Scan) calls its function with.
func entriesOf(ctx context.Context, scan func(context.Context, string, time.Time, time.Time, func(Entry) error) error,
	tenant string, from, to time.Time) ([]Entry, error) {
	var out []Entry
	err := scan(ctx, tenant, from, to, func(e Entry) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
