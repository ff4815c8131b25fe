package intent

import (
	"context"
	"errors"
	"hash/crc32"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// A client follows an execution to its end through a Delivery: the chunks of the epoch it
// follows, until one of them ends the execution. The chunk stream is not the truth, the record
// is: a terminal chunk or a fence can be missing (its writer died between the record and the
// chunk, or the follower's consumer lost it in a NATS failure), so a delivery that has been
// idle for idleEvery reads the record, and one whose feed ended reads it at once. What the
// record says ends the delivery exactly as a replay of it would, provided what the client was
// already sent is the start of the record's events (the same epoch, the same bytes); a
// takeover is followed to the new epoch only while nothing of the old one was sent. Anything
// else is a Restarted event or an error: never a splice, never a silent end.

// idleEvery is how long Next waits without a chunk before it returns an Idle event (a stream
// sends its heartbeat) and, on the call after, reads the record. A non-stream execution sends
// nothing until its end, so its copies read the record this often while it runs (one KV read
// each, from any replica).
const idleEvery = 5 * time.Second

// EventKind says what Delivery.Next returned.
type EventKind int

// Events of a delivery. Data and Usage are output of the epoch followed; Idle is a silence;
// the others end the delivery.
const (
	// Data carries SSE event frames of a streamed execution (Payload).
	Data EventKind = iota + 1
	// Usage carries the usage-only frame (Payload).
	Usage
	// Idle: nothing came for a while (send a heartbeat); the next Next reads the record first.
	Idle
	// Done: a streamed execution completed; everything it sent came before.
	Done
	// Result: a non-stream execution's answer (Status, Payload, Meta.ContentType).
	Result
	// Error: the execution failed (Status, Payload: a provider-format error body;
	// Meta.RetryAfter when the client may come back).
	Error
	// Finished: the execution ended in a way the chunks do not carry to this follower (its
	// terminal chunk never came, it was taken over and finished, its early output was lost):
	// View is its finished record, and Continues says whether it continues what was sent.
	Finished
	// Restarted: the execution was taken over after this follower was sent output of the
	// epoch it followed; it cannot be continued on this connection.
	Restarted
)

// Meta says how an answer was obtained (it travels on an epoch's first and terminal chunks).
type Meta struct {
	Backend  string
	Attempts int
	Degraded bool
	// RetryAfter (seconds) on an Error the client may retry later.
	RetryAfter int
	// ContentType of a Result's payload when it is not JSON's (a passthrough answer).
	ContentType string
}

var eventNames = [...]string{Data: "data", Usage: "usage", Idle: "idle", Done: "done", Result: "result", Error: "error",
	Finished: "finished", Restarted: "restarted"}

func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one step of a delivery.
type Event struct {
	Kind EventKind
	// View is a Finished event's record (its Answer may be nil: a record without a result).
	View *View
	// SameEpoch: View finished the epoch this delivery followed.
	SameEpoch bool
	// Continues: SameEpoch, the execution streamed, and the output sent so far (Sent) is the
	// start of View's events; Rest is what follows it there.
	Continues bool
	Rest      []byte
	// UsageSent: the usage frame of the epoch was sent.
	UsageSent bool
	// Sent: output of the epoch followed was sent (Delivery.Sent) before this event.
	Sent bool

	chunk jobs.Chunk
}

// Payload is a chunk event's bytes (shared: never modify them).
func (e Event) Payload() []byte { return e.chunk.Payload }

// Status is a Result's or an Error's HTTP status.
func (e Event) Status() int { return e.chunk.Status }

// Index is the chunk's position in its epoch (0: the first, which starts an epoch over).
func (e Event) Index() int { return e.chunk.Idx }

// Meta is how the answer was obtained, on an epoch's first and terminal chunks.
func (e Event) Meta() Meta {
	m := e.chunk.Meta
	return Meta{Backend: m.Backend, Attempts: m.Attempts, Degraded: m.Degraded, RetryAfter: m.RetryAfter, ContentType: m.ContentType}
}

// Shared returns derive(Payload), computed once per chunk for all the followers of a feed:
// derive must be pure and the same for every caller; the result must not be modified.
func (e Event) Shared(derive func([]byte) []byte) []byte { return e.chunk.Shared(derive) }

// sent is what a delivery sent of its epoch: the data chunks' bytes as stored (their count
// and checksum, not a copy) and whether the usage chunk passed.
type sent struct {
	n     int
	crc   uint32
	usage bool
	any   bool
}

func (s *sent) data(payload []byte) {
	s.n += len(payload)
	s.crc = crc32.Update(s.crc, crc32.IEEETable, payload)
}

// continues reports whether events start with what was sent.
func (s *sent) continues(events []byte) bool {
	return s.n <= len(events) && crc32.ChecksumIEEE(events[:s.n]) == s.crc
}

// Delivery follows one execution for one client, to its end. Not safe for concurrent use.
type Delivery struct {
	core *Core
	adm  *Admission // whose feed and record follow the takeovers; nil for a job's event stream
	key  string
	// epoch is the epoch followed.
	epoch int
	fl    *jobs.Follower
	local bool // a local execution: its feed is all there is (no record to read)
	idle  time.Duration
	timer *time.Timer
	check bool // the last Next was Idle: read the record before waiting again
	sent  sent
}

// Delivery is the delivery of the execution a created, joined or bypassed request follows;
// nil for a replay (answer from View). Admission.Close ends it.
func (a *Admission) Delivery() *Delivery {
	if a.fl == nil {
		return nil
	}
	switch {
	case a.d != nil:
	case a.local:
		a.d = FeedOf(a.fl, idleEvery)
	default:
		a.d = &Delivery{core: a.core, adm: a, key: a.Key, epoch: a.Rec.Epoch, fl: a.fl, idle: idleEvery}
	}
	return a.d
}

// FeedOf is the delivery of a bare feed with no record behind it (as a local execution's):
// its chunks until a terminal one, an Idle event after each silence of idle.
func FeedOf(fl *jobs.Follower, idle time.Duration) *Delivery {
	return &Delivery{fl: fl, local: true, idle: idle}
}

// FollowJob is the delivery of job j (still running) to an event stream a client of its
// tenant opened: it takes one of the tenant's streams first (a *LimitError at the cap,
// limits.go); release gives it back once the stream has ended. Close the delivery.
func (c *Core) FollowJob(ctx context.Context, j *View) (d *Delivery, release func(), err error) {
	fl, release, err := c.FollowStream(ctx, j.Tenant, j.key, j.ID, j.Epoch, j.Stream)
	if err != nil {
		return nil, nil, err
	}
	return &Delivery{core: c, key: j.key, epoch: j.Epoch, fl: fl, idle: idleEvery}, release, nil
}

// Ready reports whether the next chunk is already here (a writer flushes only when not).
func (d *Delivery) Ready() bool { return d.fl != nil && d.fl.Ready() }

// Sent records that ev, an output event, reached the client: a takeover is no longer followed,
// and an end from the record must continue it.
func (d *Delivery) Sent(ev Event) {
	switch ev.Kind {
	case Data:
		d.sent.data(ev.chunk.Payload)
	case Usage:
		d.sent.usage = true
	default:
		return
	}
	d.sent.any = true
}

// Close stops following (the execution goes on for its other copies).
func (d *Delivery) Close() {
	if d.fl != nil {
		d.fl.Close()
	}
	d.stop()
}

func (d *Delivery) stop() {
	if d.timer != nil {
		d.timer.Stop()
	}
}

// Next returns the delivery's next event. An error ends it without an answer: ErrInterrupted
// (the feed ended and the record could not be read, or does not say how), ErrHistoryLost, or
// ctx's error.
func (d *Delivery) Next(ctx context.Context) (Event, error) {
	if d.check && !d.local {
		d.check = false
		if ev, end, err := d.fromRecord(ctx, false); end {
			return ev, err
		}
	}
	for {
		ch, ok, err := d.wait(ctx)
		if !ok && err == nil {
			d.check = true
			return Event{Kind: Idle}, nil
		}
		if d.local { // nothing to read or follow but the feed, which always ends with a terminal chunk
			if errors.Is(err, jobs.ErrEnded) {
				err = ErrInterrupted
			}
			if err != nil {
				return Event{}, err
			}
			return d.event(ch), nil
		}
		switch {
		case err == nil && ch.Kind != jobs.KindFence:
			return d.event(ch), nil
		case errors.Is(err, jobs.ErrHistoryLost):
			rec, _, gerr := d.core.storeOf(d.key).Get(ctx, d.key)
			if gerr == nil && rec.State != kv.Pending {
				return d.finished(rec), nil
			}
			return Event{}, ErrHistoryLost
		case err == nil && d.sent.any: // fenced after this client got output
			return Event{Kind: Restarted, Sent: true}, nil
		case err == nil, errors.Is(err, jobs.ErrEnded), errors.Is(err, jobs.ErrHubClosed):
			// Fenced (taken over) or the feed ended: see what the record says now.
			if ev, end, err := d.fromRecord(ctx, true); end {
				return ev, err
			}
		default:
			return Event{}, err
		}
	}
}

// wait waits for the next chunk, at most d.idle (ok false, no error: silence).
func (d *Delivery) wait(ctx context.Context) (jobs.Chunk, bool, error) {
	if d.fl.Ready() {
		ch, err := d.fl.Next(ctx)
		return ch, err == nil, err
	}
	// One timer per delivery, not per chunk.
	if d.timer == nil {
		d.timer = time.NewTimer(d.idle)
	} else {
		d.timer.Reset(d.idle)
	}
	return d.fl.NextOr(ctx, d.timer.C)
}

// fromRecord reads the record after a silence (ended false: a record that cannot be read, or
// still runs this epoch, means wait on) or after the feed ended or was fenced. end false: go
// on waiting, on the epoch followed or on the one it moved to.
func (d *Delivery) fromRecord(ctx context.Context, ended bool) (ev Event, end bool, err error) {
	rec, _, gerr := d.core.storeOf(d.key).Get(ctx, d.key)
	switch {
	case gerr != nil && !ended: // unreadable now: keep waiting for the chunk
		return Event{}, false, nil
	case gerr != nil:
		return Event{}, true, ErrInterrupted
	case rec.State != kv.Pending:
		if d.adm != nil {
			d.adm.Rec = rec
		}
		return d.finished(rec), true, nil
	case rec.Epoch == d.epoch && !ended:
		d.core.checkHolder(d.key, rec) // silence: its holder may be gone
		return Event{}, false, nil
	case d.sent.any && rec.Epoch != d.epoch: // taken over after this client got output
		return Event{Kind: Restarted, Sent: true}, true, nil
	case d.sent.any:
		return Event{}, true, ErrInterrupted
	}
	// Nothing of this epoch was sent: follow the one the record is at (the chunks restart at 0).
	if err := d.follow(ctx, rec); err != nil {
		return Event{}, true, err
	}
	return Event{}, false, nil
}

// follow switches to the chunks of rec's epoch (the execution was taken over).
func (d *Delivery) follow(ctx context.Context, rec *kv.Record) error {
	if d.adm != nil {
		d.adm.Rec = rec
	}
	d.fl.Close()
	fl, err := d.core.joinExecution(ctx, d.key, rec.JobID, rec.Epoch, rec.Stream)
	if err != nil {
		return ErrInterrupted
	}
	d.fl, d.epoch, d.sent = fl, rec.Epoch, sent{}
	if d.adm != nil {
		d.adm.fl = fl
	}
	return nil
}

// event is the event of a chunk of the epoch followed.
func (d *Delivery) event(ch jobs.Chunk) Event {
	ev := Event{chunk: ch, Sent: d.sent.any}
	switch ch.Kind {
	case jobs.KindData:
		ev.Kind = Data
	case jobs.KindUsage:
		ev.Kind = Usage
	case jobs.KindDone:
		ev.Kind = Done
	case jobs.KindResult:
		ev.Kind = Result
	case jobs.KindError:
		ev.Kind = Error
	default: // a fence (a local feed has none) or a kind this node does not know
		ev.Kind = Restarted
	}
	return ev
}

// finished is the Finished event of rec, a finished record, for what this delivery sent.
func (d *Delivery) finished(rec *kv.Record) Event {
	ev := Event{Kind: Finished, View: viewOf(d.key, rec), SameEpoch: rec.Epoch == d.epoch, UsageSent: d.sent.usage, Sent: d.sent.any}
	if res := rec.Result; ev.SameEpoch && res != nil && rec.Stream && d.sent.continues(res.Events) {
		ev.Continues, ev.Rest = true, res.Events[d.sent.n:]
	}
	return ev
}
