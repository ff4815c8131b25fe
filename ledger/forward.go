package ledger

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Appends are forwarded to the node whose server leads the ledger's stream.
//
// A tenant's chain takes one entry at its head at a time: an append that finds the head moved
// is refused and re-reads the chain. On a cluster every node's workers charge, so most appends
// found the head moved by another node (0.75 refused publishes and a catch-up read per charge
// at three nodes, issue 44), and each node's batches held only its own charges. So the node
// whose embedded server leads the stream serves appends (ServeAppends): the others send it
// their entries as a core request, it commits them in its chain's batches with its own, at the
// leader, and answers with the stored entry. Nothing depends on the forward for correctness:
// an append is idempotent by its id (the chain's index and Nats-Msg-Id), so when nobody serves
// (no responders: at once), the server is busy, or no answer comes within forwardWait (the
// appender died), the caller appends itself as before, and an entry the appender stored all
// the same is found, not stored twice. An append with a fence check (ChargeInput.Expect)
// stays local: the check runs in the writer's process.
//
// With a secret (WithSecret) the appender signs what it appends, so a request must be signed
// too: it carries an HMAC-SHA-256 of its body under the secret (header Og-Ledger-Mac), and one
// without a valid MAC is refused. Else anyone who can publish on the NATS account could have
// entries of their making signed, which a keyed chain exists to prevent (billing.md: a chain
// recomputed without the secret fails verify). Without a secret nothing is signed, and anyone
// who can publish could write LEDGER directly anyway.

// forwardPrefix starts the subject a partition's appender serves: forwardPrefix + stream.
const forwardPrefix = "og.ledger.append."

// forwardQueue is the queue group of the appenders: while leadership moves, the old and the
// new leader's nodes may both serve for a moment, and each request goes to one of them.
const forwardQueue = "appenders"

// forwardWait bounds the wait for an appender's answer; after it the caller appends itself.
const forwardWait = time.Second

// leaderCheckEvery is how often ServeAppends asks the embedded server whether it leads the
// stream (a read of the server's memory, no request).
const leaderCheckEvery = 100 * time.Millisecond

// maxForwarded bounds the forwarded appends one appender holds at once; past it a request is
// answered "busy" and its sender appends itself.
const maxForwarded = 4096

// errBusy is an appender's answer when it holds maxForwarded appends.
var errBusy = errors.New("ledger: appender busy")

// errUnsigned is an appender's answer to a request whose MAC is missing or wrong.
var errUnsigned = errors.New("ledger: forwarded append not signed with this ledger's secret")

// macHeader carries a forward request's MAC; macDomain starts what the MAC covers, so that it
// is never the HMAC of anything else made under the same secret (an entry's, a heads file's).
const (
	macHeader = "Og-Ledger-Mac"
	macDomain = "oncegate ledger forwarded append v1\n"
)

// requestMAC is the HMAC-SHA-256 of body under secret, in macDomain (hex in macHeader).
func requestMAC(secret, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(macDomain))
	m.Write(body)
	return m.Sum(nil)
}

// signedBy reports whether m carries a valid MAC of its body under secret (always true
// without a secret).
func signedBy(secret []byte, m *nats.Msg) bool {
	if secret == nil {
		return true
	}
	got, err := hex.DecodeString(m.Header.Get(macHeader))
	return err == nil && hmac.Equal(got, requestMAC(secret, m.Data))
}

// WithLeaderCheck says whether the embedded server in this process leads a stream (by name).
// With it the ledger forwards its appends to the process that does (see ServeAppends) and
// appends itself only when that one does not answer; without it (an external NATS, where no
// process can tell cheaply) every process appends itself.
func WithLeaderCheck(leads func(stream string) bool) Option {
	return func(l *Ledger) { l.leads = leads }
}

type forwardRequest struct {
	E     Entry     `json:"e"`
	After time.Time `json:"after,omitzero"`
}

type forwardReply struct {
	E       Entry  `json:"e"`
	Created bool   `json:"created"`
	Err     string `json:"err,omitempty"`
}

// forwardSubject is the subject l's appender serves.
func (l *Ledger) forwardSubject() string { return forwardPrefix + l.streamName }

// forward sends e to the stream leader's appender. ok is false when the caller must append
// itself: no appender, no answer in time, or the appender's append failed (the caller's own
// attempt then returns that failure as it sees it). Either way it is counted
// (oncegate_ledger_forwards_total).
func (l *Ledger) forward(ctx context.Context, e Entry, after time.Time) (stored Entry, created, ok bool) {
	stored, created, ok = l.tryForward(ctx, e, after)
	l.metrics.LedgerForward(ok)
	return stored, created, ok
}

func (l *Ledger) tryForward(ctx context.Context, e Entry, after time.Time) (stored Entry, created, ok bool) {
	req, err := json.Marshal(forwardRequest{E: e, After: after})
	if err != nil {
		return Entry{}, false, false
	}
	out := nats.NewMsg(l.forwardSubject())
	out.Data = req
	if l.secret != nil {
		out.Header.Set(macHeader, hex.EncodeToString(requestMAC(l.secret, req)))
	}
	fctx, cancel := context.WithTimeout(ctx, l.forwardWait)
	defer cancel()
	msg, err := l.js.Conn().RequestMsgWithContext(fctx, out)
	if err != nil {
		if !errors.Is(err, nats.ErrNoResponders) {
			l.log.Debug().Err(err).Str(fieldEntryID, e.ID).Msg("forwarded append unanswered; appending here")
		}
		return Entry{}, false, false
	}
	var rep forwardReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil || rep.Err != "" {
		l.log.Debug().Err(err).Str("appender_error", rep.Err).Str(fieldEntryID, e.ID).Msg("forwarded append refused; appending here")
		return Entry{}, false, false
	}
	if rep.E.ID != e.ID {
		l.log.Warn().Str(fieldEntryID, e.ID).Str("answered_id", rep.E.ID).Msg("appender answered for another entry; appending here")
		return Entry{}, false, false
	}
	return rep.E, rep.Created, true
}

// forwards reports whether an append with no fence check goes to the appender first: a leader
// check is set and this process does not serve the appends itself.
func (l *Ledger) forwards() bool { return l.leads != nil && !l.serving.Load() }

// ServeAppends serves the ledger's forwarded appends while the embedded server leads its
// stream (WithLeaderCheck; without it ServeAppends returns at once), until ctx ends. It waits
// for the appends it took to be answered before it returns.
func (l *Ledger) ServeAppends(ctx context.Context) error {
	if l.leads == nil {
		return nil
	}
	nc := l.js.Conn()
	var held sync.WaitGroup
	// The appends outlive a stop by at most their own bound: a caller waits for them.
	actx := context.WithoutCancel(ctx)
	slots := make(chan struct{}, maxForwarded)
	handle := func(m *nats.Msg) {
		if !signedBy(l.secret, m) {
			l.log.Warn().Str("subject", m.Subject).Msg("refused a forwarded ledger append without a valid MAC")
			l.answer(m, forwardReply{Err: errUnsigned.Error()})
			return
		}
		var req forwardRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			l.answer(m, forwardReply{Err: fmt.Sprintf("%v: %v", ErrInvalid, err)})
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			l.answer(m, forwardReply{Err: errBusy.Error()})
			return
		}
		held.Go(func() {
			defer func() { <-slots }()
			rctx, cancel := context.WithTimeout(actx, l.forwardWait)
			defer cancel()
			out, created, err := l.appendHere(rctx, req.E, nil, req.After)
			rep := forwardReply{E: out, Created: created}
			if err != nil {
				rep = forwardReply{Err: err.Error()}
			}
			l.answer(m, rep)
		})
	}
	var sub *nats.Subscription
	stop := func() {
		if sub != nil {
			_ = sub.Unsubscribe()
			sub = nil
		}
		l.serving.Store(false)
	}
	defer held.Wait()
	defer stop()
	t := time.NewTicker(leaderCheckEvery)
	defer t.Stop()
	for {
		switch lead := l.leads(l.streamName); {
		case lead && sub == nil:
			s, err := nc.QueueSubscribe(l.forwardSubject(), forwardQueue, handle)
			if err != nil {
				return fmt.Errorf("ledger: serve appends: %w", err)
			}
			sub = s
			l.serving.Store(true)
			l.log.Debug().Str("stream", l.streamName).Msg("serving the ledger's appends (stream leader here)")
		case !lead && sub != nil:
			stop()
			l.log.Debug().Str("stream", l.streamName).Msg("no longer serving the ledger's appends")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (l *Ledger) answer(m *nats.Msg, rep forwardReply) {
	b, err := json.Marshal(rep)
	if err != nil { // an Entry's fields always marshal
		b = []byte(`{"err":"ledger: encode answer"}`)
	}
	if err := m.Respond(b); err != nil {
		l.log.Debug().Err(err).Msg("answering a forwarded append")
	}
}
