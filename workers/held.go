package workers

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/jobs"
)

// A held job is a new execution that the node which admitted it runs itself (issue 44). Its
// job is its claim, stored under a Nats-Msg-Id (kv.ClaimMsgID), and handed to the pool in
// process (jobs.HeldMsg): no JOBS write, consumer delivery, ack or work-queue removal, four of
// a cluster intent's eight replicated writes, and the consumer's hop off the latency.
//
// What JetStream's redelivery gave a queued job, the pool gives a held one:
//   - a job handed back (a NakWithDelay: its key busy here, a read that failed, a terminal
//     chunk unwritten) is handled again after the delay, as a redelivery would be
//     (heldMsg.NumDelivered grows);
//   - a job whose pool died is found by another node's sweep: its record names the pool
//     (kv.Record.Worker, from the claim on), which stops answering for itself (jobs.PoolGone),
//     and the sweep takes the execution over at once (Pool.takeOverGone), or once its lease
//     ran out if the owner's absence cannot be told (Sweep).

// Held is one of the pool's execution slots, reserved for a held job. Exactly one of Run and
// Release is called, once.
type Held struct {
	p     *Pool
	ctx   context.Context
	state atomic.Int32 // heldReserved, then heldRunning or heldReleased
}

const (
	heldReserved = iota
	heldRunning
	heldReleased
)

// Hold reserves a slot for a job this node admits and will run (intent.Holder); nil when
// none is free or the pool is not running (the caller queues the job). Run waits for it at
// shutdown until it runs or is released.
func (p *Pool) Hold() *Held {
	p.localMu.Lock()
	defer p.localMu.Unlock()
	if p.localCtx == nil {
		return nil
	}
	select {
	case p.slots <- struct{}{}:
	default:
		return nil
	}
	p.localWG.Add(1)
	return &Held{p: p, ctx: p.localCtx}
}

// Worker names the pool: the held job's claim must name it (kv.Record.Worker).
func (h *Held) Worker() string { return h.p.opts.ID }

// Release gives the slot back unused (the claim or the job's publish failed).
func (h *Held) Release() {
	if h.state.CompareAndSwap(heldReserved, heldReleased) {
		<-h.p.slots
		h.p.localWG.Done()
	}
}

// Run runs the held job m, stored in JOBS at at, as if the workers' consumer had delivered it;
// its notices go to local first (nil: none).
func (h *Held) Run(m *nats.Msg, at time.Time, local jobs.LocalNotices) {
	if !h.state.CompareAndSwap(heldReserved, heldRunning) {
		return
	}
	go func() {
		defer h.p.localWG.Done()
		h.p.runHeld(h.ctx, &heldMsg{msg: m, at: at, delivered: 1, local: local})
	}()
}

// runHeld handles m with the slot Hold took, and again after each delay it is handed back
// with, without a slot while it waits. It stops when m is settled or ctx ends: a job left
// then is its record's, PENDING and naming this pool, which a sweep elsewhere takes over
// once the pool is gone.
func (p *Pool) runHeld(ctx context.Context, m *heldMsg) {
	for {
		p.handle(ctx, m)
		<-p.slots
		delay, again := m.next()
		if !again {
			return
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
	}
}

// heldMsg is a held job as the pool handles it: the message it stored, delivered in process.
type heldMsg struct {
	msg   *nats.Msg
	at    time.Time
	local jobs.LocalNotices // the admitting hub, which takes the outcome's notice (nil: none)

	mu        sync.Mutex
	delivered uint64        // 1, then one more each time it is handed back
	again     bool          // handed back by the last handling
	delay     time.Duration // to be handled again after
}

var _ jetstream.Msg = (*heldMsg)(nil)

// next reports whether the last handling handed m back, and after how long it is handled
// again (as the delivery that many times over).
func (m *heldMsg) next() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.again {
		return 0, false
	}
	m.again = false
	m.delivered++
	return m.delay, true
}

func (m *heldMsg) handBack(d time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.again, m.delay = true, d
	return nil
}

func (m *heldMsg) settle() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.again = false
	return nil
}

func (m *heldMsg) Metadata() (*jetstream.MsgMetadata, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return &jetstream.MsgMetadata{NumDelivered: m.delivered, Timestamp: m.at}, nil
}

func (m *heldMsg) Data() []byte                           { return m.msg.Data }
func (m *heldMsg) Headers() nats.Header                   { return m.msg.Header }
func (m *heldMsg) Subject() string                        { return m.msg.Subject }
func (m *heldMsg) Reply() string                          { return "" }
func (m *heldMsg) Ack() error                             { return m.settle() }
func (m *heldMsg) DoubleAck(context.Context) error        { return m.settle() }
func (m *heldMsg) Term() error                            { return m.settle() }
func (m *heldMsg) TermWithReason(string) error            { return m.settle() }
func (m *heldMsg) Nak() error                             { return m.handBack(0) }
func (m *heldMsg) NakWithDelay(delay time.Duration) error { return m.handBack(delay) }
func (m *heldMsg) InProgress() error                      { return nil } // the lease's renewals keep it
