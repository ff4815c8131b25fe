package cold

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsleader"
)

// moveBytes bounds the hot messages one fetch reads; a mark follows each fetch, so a mover
// that stops loses at most one fetch's work.
const moveBytes = 8 << 20

// errMarkMoved: another node's mover advanced the mark first; this round stops.
var errMarkMoved = errors.New("cold: another mover advanced the mark")

// runMover runs a round now and every cfg.Every until ctx ends.
func (t *Tier) runMover(ctx context.Context) {
	tick := time.NewTicker(t.cfg.Every)
	defer tick.Stop()
	for {
		if err := t.moveRound(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, errMarkMoved) {
			t.cfg.Log.Warn().Err(err).Msg("cold tier: moving hot records")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// lastMark reads the last mark from OG_COLD's leader: the mark and its sequence (0, 0: none).
func (t *Tier) lastMark(ctx context.Context) (mark, uint64, time.Time, error) {
	m, err := jsleader.Get(ctx, t.js.Conn(), jsleader.APIPrefix(t.js), t.name, jsleader.Request{LastBySubject: t.mark})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return mark{}, 0, time.Time{}, nil
	}
	if err != nil {
		return mark{}, 0, time.Time{}, fmt.Errorf("cold: read the last mark: %w", err)
	}
	var mk mark
	if err := json.Unmarshal(m.Data, &mk); err != nil {
		return mark{}, 0, time.Time{}, fmt.Errorf("cold: mark %d: %w", m.Seq, err)
	}
	return mk, m.Seq, m.Time, nil
}

// moverStale is how long after another node's last mark this node's mover takes the rounds
// over: that mover stopped (or its node did). Until then this node's rounds only read the
// mark, so a cluster's nodes do not each copy every record.
func (t *Tier) moverStale() time.Duration { return 3*t.cfg.Every + time.Second }

// moveRound copies the hot messages older than MoveAfter that the last mark does not cover,
// then marks them. A round that loses the mark's compare-and-set to another node stops: its
// copies are duplicates (Nats-Msg-Id) or harmless (the index keeps a key's newest revision).
func (t *Tier) moveRound(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	mk, markSeq, marked, err := t.lastMark(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	if mk.Node != "" && mk.Node != t.cfg.Node && now.Sub(marked) < t.moverStale() {
		return nil // another node's mover is at work
	}
	// On a grid of Every: movers racing from one mark in one period pack alike (Nats-Msg-Id).
	cutoff := now.Add(-t.cfg.MoveAfter).Truncate(t.cfg.Every)
	if mk.W > 0 && time.Unix(0, mk.W).Before(now.Add(-t.cfg.HotTTL)) {
		// Records written before now - HotTTL may have expired from the hot bucket uncopied.
		t.cfg.Log.Error().Time("watermark", time.Unix(0, mk.W)).Dur("hot_ttl", t.cfg.HotTTL).
			Msg("cold tier: no mover ran for longer than half the hot TTL; records that left the hot tier meanwhile may not have been copied, and their keys would be new")
	}
	src, err := t.js.Stream(ctx, t.cfg.Source)
	if err != nil {
		return fmt.Errorf("cold: %s: %w", t.cfg.Source, err)
	}
	state := src.CachedInfo().State // read from the leader just now
	began, from := time.Now(), mk.Seq
	if state.Msgs > 0 && state.LastSeq > mk.Seq {
		due, err := t.due(ctx, src, mk.Seq, cutoff)
		if err != nil || !due.ok {
			return err // on !ok a replica behind its leader answered: the next round goes on
		}
		if due.stored.Before(cutoff) {
			var caughtUp bool
			if mk, markSeq, caughtUp, err = t.copyFrom(ctx, mk, markSeq, cutoff, state.LastSeq); err != nil || !caughtUp {
				return err
			}
		}
	}
	// Every hot message stored before cutoff is in OG_COLD. A mark every round, moved or not:
	// the other nodes' movers see this one at work.
	mk = mark{Seq: mk.Seq, W: max(cutoff.UnixNano(), mk.W), Node: t.cfg.Node}
	if _, err := t.publishMark(ctx, mk, markSeq); err != nil {
		return err
	}
	if mk.Seq > from {
		t.cfg.Log.Debug().Uint64("from", from).Uint64("to", mk.Seq).Dur("took", time.Since(began)).
			Time("watermark", time.Unix(0, mk.W)).Msg("cold tier: moved")
	}
	return nil
}

// firstAfter is the first hot message after a mark's sequence, as a round read it.
type firstAfter struct {
	mark   uint64
	stored time.Time
	ok     bool
}

// due reads when the first hot message after the mark's sequence seq was stored (ok false: the
// replica that answered has none). An earlier round's answer for the same mark stands while it
// is not due yet: a message after it is newer, and an idle cluster's rounds ask nothing more.
func (t *Tier) due(ctx context.Context, src jetstream.Stream, seq uint64, cutoff time.Time) (firstAfter, error) {
	if f := t.first; f.ok && f.mark == seq && !f.stored.Before(cutoff) {
		return f, nil
	}
	m, err := src.GetMsg(ctx, seq+1, jetstream.WithGetMsgSubject(">"))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return firstAfter{}, nil
	}
	if err != nil {
		return firstAfter{}, fmt.Errorf("cold: read %s from %d: %w", t.cfg.Source, seq+1, err)
	}
	t.first = firstAfter{mark: seq, stored: m.Time, ok: true}
	return t.first, nil
}

// copyFrom copies the hot messages after mk stored before cutoff, reading them through one
// ephemeral pull consumer made for the round (not batched direct gets: on a bucket that keeps
// one message per key, the server walks every key's subject to answer each batch, and a mover
// of a million hot keys fell behind its writers), and publishes a mark after each fetch.
// caughtUp: every message before cutoff, or through last (the leader's last when the round
// began), is copied.
func (t *Tier) copyFrom(ctx context.Context, mk mark, markSeq uint64, cutoff time.Time, last uint64) (_ mark, _ uint64, caughtUp bool, err error) {
	cons, err := t.js.CreateConsumer(ctx, t.cfg.Source, jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: mk.Seq + 1,
		AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true, Replicas: 1, InactiveThreshold: time.Minute})
	if err != nil {
		return mk, markSeq, false, fmt.Errorf("cold: read %s from %d: %w", t.cfg.Source, mk.Seq+1, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = t.js.DeleteConsumer(dctx, t.cfg.Source, cons.CachedInfo().Name) // else it goes after a minute idle
	}()
	delivered := uint64(0) // the consumer sequence of the last message read
	for {
		batch, err := cons.FetchBytes(moveBytes, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return mk, markSeq, false, fmt.Errorf("cold: fetch %s from %d: %w", t.cfg.Source, mk.Seq+1, err)
		}
		var msgs []hotMsg
		end := false
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil || meta.Sequence.Consumer != delivered+1 {
				end = true // a message lost on its way: the next round reads on from the mark
				break
			}
			delivered = meta.Sequence.Consumer
			msgs = append(msgs, hotMsg{subject: m.Subject(), seq: meta.Sequence.Stream, header: m.Headers(), data: m.Data(), stored: meta.Timestamp})
			if !meta.Timestamp.Before(cutoff) || meta.Sequence.Stream >= last || meta.NumPending == 0 {
				end = true // the rest is not due yet, or the end of this replica's stream
				break
			}
		}
		next, reached, err := t.copyAll(ctx, msgs, cutoff)
		if err != nil {
			return mk, markSeq, false, err
		}
		next.Seq, next.W, next.Node = max(next.Seq, mk.Seq), max(next.W, mk.W), t.cfg.Node
		if reached || next.Seq >= last {
			return next, markSeq, true, nil // the caller marks the cutoff
		}
		if len(msgs) == 0 {
			return mk, markSeq, false, nil
		}
		if markSeq, err = t.publishMark(ctx, next, markSeq); err != nil {
			return mk, markSeq, false, err
		}
		mk = next
		if end {
			return mk, markSeq, false, nil
		}
	}
}

// hotMsg is one hot message read by the mover.
type hotMsg struct {
	subject string
	seq     uint64
	header  nats.Header
	data    []byte
	stored  time.Time
}

// copyAll publishes msgs to OG_COLD up to the first one stored at or after cutoff (reached),
// in packs and in stream order, and waits for their acknowledgements; the mark that covers them.
func (t *Tier) copyAll(ctx context.Context, msgs []hotMsg, cutoff time.Time) (mark, bool, error) {
	var mk mark
	var acks []jetstream.PubAckFuture
	publish := func(m *nats.Msg) error {
		f, err := t.js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("cold: copy: %w", err)
		}
		acks = append(acks, f)
		return nil
	}
	var p pack
	flush := func() error {
		if p.n == 0 {
			return nil
		}
		m := p.msg(t.recordSubject(p.written))
		p = pack{} // not the body's buffer: the message keeps it until acknowledged (a retry sends it again)
		return publish(m)
	}
	reached := false
	for _, m := range msgs {
		if !m.stored.Before(cutoff) {
			reached = true
			break
		}
		if m.header.Get("Nats-Marker-Reason") == "" { // an expiry marker is no write
			r := t.recordOf(m)
			switch {
			case r.packedSize() > packBytes/2: // alone, after the records before it
				if err := flush(); err != nil {
					return mark{}, false, err
				}
				if err := publish(t.single(r)); err != nil {
					return mark{}, false, err
				}
			default:
				if p.n > 0 && (len(p.body)+r.packedSize() > packBytes || unixHour(r.written) != unixHour(p.written)) {
					if err := flush(); err != nil {
						return mark{}, false, err
					}
				}
				p.add(r)
			}
		}
		mk = mark{Seq: m.seq, W: m.stored.UnixNano()}
	}
	if err := flush(); err != nil {
		return mark{}, false, err
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return mark{}, false, fmt.Errorf("cold: copy: %w", err)
		case <-ctx.Done():
			return mark{}, false, ctx.Err()
		}
	}
	return mk, reached, nil
}

// recordOf is hot message m as a record to copy.
func (t *Tier) recordOf(m hotMsg) record {
	r := record{key: strings.TrimPrefix(m.subject, t.cfg.Prefix), rev: m.seq, written: m.stored, op: opPut, data: m.data}
	if op := m.header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		r.op, r.data = opDel, nil
	}
	return r
}

// single is the OG_COLD message of a record copied alone: its fields in headers, its data as
// the body.
func (t *Tier) single(r record) *nats.Msg {
	c := nats.NewMsg(t.recordSubject(r.written))
	c.Header.Set(hdrKey, r.key)
	c.Header.Set(hdrRev, strconv.FormatUint(r.rev, 10))
	c.Header.Set(hdrWritten, strconv.FormatInt(r.written.UnixNano(), 10))
	if r.op == opDel {
		c.Header.Set(hdrOp, "del")
	}
	c.Data = r.data
	c.Header.Set(jetstream.MsgIDHeader, r.key+"."+strconv.FormatUint(r.rev, 10))
	return c
}

// pack is a pack being filled: records of one hour of writes, in stream order.
type pack struct {
	body        []byte
	n           int
	first, last uint64 // revisions (hot sequences)
	written     time.Time
}

func (p *pack) add(r record) {
	if p.n == 0 {
		p.first, p.written = r.rev, r.written
	}
	p.body, p.n, p.last = appendRecord(p.body, r), p.n+1, r.rev
}

// msg is the pack's message on subject. Its Nats-Msg-Id names the hot sequences it holds:
// movers racing from one mark pack a batch alike, and OG_COLD stores it once.
func (p *pack) msg(subject string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(hdrPack, packFormat)
	m.Header.Set(jetstream.MsgIDHeader, "pack."+strconv.FormatUint(p.first, 10)+"-"+strconv.FormatUint(p.last, 10))
	m.Data = p.body
	return m
}

// publishMark writes mk if the last mark is still at seq; its sequence.
func (t *Tier) publishMark(ctx context.Context, mk mark, seq uint64) (uint64, error) {
	data, err := json.Marshal(mk)
	if err != nil {
		return 0, err
	}
	m := nats.NewMsg(t.mark)
	m.Data = data
	expectLast(m, seq)
	ack, err := t.js.PublishMsg(ctx, m)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return 0, errMarkMoved
	}
	if err != nil {
		return 0, fmt.Errorf("cold: publish mark: %w", err)
	}
	return ack.Sequence, nil
}
