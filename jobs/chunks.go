package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jspub"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/partition"
)

// Kind says what a chunk carries.
type Kind string

// Chunk kinds. Data and Usage are output; the others are terminal.
const (
	// KindData carries one or more SSE event frames of a streamed execution.
	KindData Kind = "data"
	// KindUsage carries the usage-only SSE frame (sent only to clients that asked for usage).
	KindUsage Kind = "usage"
	// KindResult ends a non-stream execution: Status and the response body.
	KindResult Kind = "result"
	// KindDone ends a streamed execution successfully; it is published after the record is COMPLETED.
	KindDone Kind = "done"
	// KindError ends an execution with a failure: Status and a provider-format error body.
	KindError Kind = "error"
	// KindFence ends an epoch that was taken over: the execution restarted under a new epoch.
	KindFence Kind = "fence"
	// KindStored ends a streamed epoch whose outcome is in its record but whose output chunks
	// may not all be on the subject (they were lost with a NATS failure, or written by an
	// owner that died): written from outside the owner, which cannot know how many chunks a
	// follower should have. A follower's feed ends with ErrStored and it answers from the
	// record.
	KindStored Kind = "stored"
)

const (
	hdrKind       = "Og-Kind"
	hdrIdx        = "Og-Idx"
	hdrStatus     = "Og-Status"
	hdrBackend    = "Og-Backend"
	hdrAttempts   = "Og-Attempts"
	hdrDegraded   = "Og-Degraded"
	hdrRetryAfter = "Og-Retry-After"
	hdrType       = "Og-Content-Type"
	// hdrWriter names the Publisher that wrote a chunk, so a retry whose first try landed
	// recognises its own chunk (and never another writer's chunk of the same index).
	hdrWriter = "Og-Writer"
)

// Meta says how an answer was obtained; it travels on an execution's first and terminal
// chunks, where the HTTP handler turns it into response headers.
type Meta struct {
	Backend  string
	Attempts int
	Degraded bool
	// RetryAfter (seconds) on a terminal error the client may retry later.
	RetryAfter int
	// ContentType of a result's payload when it is not JSON's (a passthrough answer).
	ContentType string
}

// ErrFenced is returned by a Publisher whose epoch was taken over: its writes are refused.
var ErrFenced = errors.New("jobs: execution fenced (epoch taken over)")

// Chunk is one message of an execution's output.
type Chunk struct {
	Idx     int
	Kind    Kind
	Status  int
	Payload []byte
	Meta    Meta
	// shared holds the one derived form of Payload that every follower of a feed reuses.
	shared *derived
}

type derived struct {
	once sync.Once
	v    []byte
}

// Shared returns derive(c.Payload), computed once per chunk for all the followers of a feed
// (a thousand SSE clients of one execution need not each rewrite the same bytes). derive must
// be a pure function, and the same one for every caller of a given chunk; the result is shared
// and must not be modified.
func (c Chunk) Shared(derive func([]byte) []byte) []byte {
	if c.shared == nil {
		return derive(c.Payload)
	}
	c.shared.once.Do(func() { c.shared.v = derive(c.Payload) })
	return c.shared.v
}

// Terminal reports whether the chunk ends its execution's stream.
func (c Chunk) Terminal() bool {
	switch c.Kind {
	case KindResult, KindDone, KindError, KindFence, KindStored:
		return true
	}
	return false
}

func (c Chunk) msg(subject string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(hdrKind, string(c.Kind))
	m.Header.Set(hdrIdx, strconv.Itoa(c.Idx))
	if c.Status != 0 {
		m.Header.Set(hdrStatus, strconv.Itoa(c.Status))
	}
	if c.Meta.Backend != "" {
		m.Header.Set(hdrBackend, c.Meta.Backend)
	}
	if c.Meta.Attempts != 0 {
		m.Header.Set(hdrAttempts, strconv.Itoa(c.Meta.Attempts))
	}
	if c.Meta.Degraded {
		m.Header.Set(hdrDegraded, "true")
	}
	if c.Meta.RetryAfter != 0 {
		m.Header.Set(hdrRetryAfter, strconv.Itoa(c.Meta.RetryAfter))
	}
	if c.Meta.ContentType != "" {
		m.Header.Set(hdrType, c.Meta.ContentType)
	}
	m.Data = c.Payload
	return m
}

func decodeChunk(h nats.Header, data []byte) (Chunk, error) {
	idx, err := strconv.Atoi(h.Get(hdrIdx))
	if err != nil {
		return Chunk{}, fmt.Errorf("jobs: chunk index %q: %w", h.Get(hdrIdx), err)
	}
	c := Chunk{Idx: idx, Kind: Kind(h.Get(hdrKind)), Payload: data}
	if s := h.Get(hdrStatus); s != "" {
		if c.Status, err = strconv.Atoi(s); err != nil {
			return Chunk{}, fmt.Errorf("jobs: chunk status %q: %w", s, err)
		}
	}
	c.Meta.Backend = h.Get(hdrBackend)
	c.Meta.Attempts, _ = strconv.Atoi(h.Get(hdrAttempts))
	c.Meta.Degraded = h.Get(hdrDegraded) == "true"
	c.Meta.RetryAfter, _ = strconv.Atoi(h.Get(hdrRetryAfter))
	c.Meta.ContentType = h.Get(hdrType)
	return c, nil
}

// newChunk is chunk idx of an execution as its writer makes it: the first and the terminal
// chunk say how the answer was obtained (meta, and retryAfter on a terminal error).
func newChunk(idx int, kind Kind, status int, payload []byte, meta Meta, retryAfter int) Chunk {
	c := Chunk{Idx: idx, Kind: kind, Status: status, Payload: payload}
	if c.Idx == 0 || c.Terminal() {
		c.Meta = meta
		c.Meta.RetryAfter = retryAfter
	}
	return c
}

// Publisher appends the chunks of one execution epoch. Each publish expects the subject's last
// sequence to be the one this publisher wrote before, so once a taker has written a fence to
// the subject, every further write of the old owner is refused (ErrFenced). Not safe for
// concurrent use (Next excepted): one execution has one writer.
type Publisher struct {
	js      jetstream.JetStream
	subject string
	writer  string // random: this publisher's chunks carry it in hdrWriter
	lastSeq uint64
	next    atomic.Int64 // read by the lease renewer while the writer publishes
	meta    Meta
	// finalTTL: the terminal chunk expires this long after it lands (0: it stays until the
	// subject is purged or the stream's MaxAge); expiring says it did, as the subject's only chunk.
	finalTTL time.Duration
	expiring bool
	// notice: a terminal chunk that is the execution's first is a notice (SetNotice).
	notice bool
	// local takes the notice in process first (SetLocal): the hub of the node that admitted
	// a held job; nil: none.
	local LocalNotices
}

// LocalNotices takes an execution's notice in process: the hub of the node where a held job
// was admitted and runs (Hub.Notice). It reports whether a follower there took it.
type LocalNotices interface {
	Notice(subject string, hdr nats.Header, data []byte) bool
}

// SetLocal makes l the first taker of the notice (SetNotice): a held job's outcome goes to
// the follower that admitted it in process, whose feed does not subscribe on a cluster
// (Hub.OpenHeld). It is also published, unanswered, for the followers of copies on other
// nodes; when l takes nothing (the client left), the notice goes out as a request as usual.
func (p *Publisher) SetLocal(l LocalNotices) { p.local = l }

// minTTL is the shortest per-message TTL: the server counts them in whole seconds.
const minTTL = time.Second

// SetFinalTTL makes the terminal chunk expire d after it is written (rounded up to a second):
// the server removes it, as a purge would, without a request per execution. Only a terminal
// chunk carries it; an execution that wrote other chunks before still needs its subject purged
// (ExpiresAlone).
func (p *Publisher) SetFinalTTL(d time.Duration) {
	if d > 0 {
		d = max(d, minTTL)
	}
	p.finalTTL = d
}

// ExpiresAlone reports whether the terminal chunk was written with a TTL as the subject's only
// chunk: nothing is left on the subject once it expires, so no purge is needed.
func (p *Publisher) ExpiresAlone() bool { return p.expiring }

// SetNotice makes a terminal chunk that is the execution's first (a non-stream execution's
// outcome) a notice: a plain message on NoticeSubject, which its followers subscribe to
// (Job.Notice), instead of a stored chunk: nothing is stored, acknowledged or expired for it,
// unless no follower answers it (heard), when it is stored as the terminal chunk after all.
// The outcome must be stored before (the record is the truth for whoever missed it), and a
// notice cannot be fenced: it is sent only after the record write that a takeover would have
// refused.
func (p *Publisher) SetNotice() { p.notice = true }

// SetMeta sets what the first and the terminal chunk will say about the answer.
func (p *Publisher) SetMeta(m Meta) { p.meta = m }

// NewPublisher starts writing the execution of job; the subject must still be empty.
func NewPublisher(js jetstream.JetStream, job *Job) *Publisher {
	var w [8]byte
	_, _ = rand.Read(w[:]) // crypto/rand.Read never fails
	return &Publisher{js: js, subject: job.Subject(), writer: hex.EncodeToString(w[:])}
}

// Next is the index the next chunk will get (= chunks written so far).
func (p *Publisher) Next() int { return int(p.next.Load()) }

// Publish appends one chunk; its index is assigned here.
func (p *Publisher) Publish(ctx context.Context, kind Kind, status int, payload []byte) error {
	return p.PublishRetry(ctx, kind, status, payload, 0)
}

// PublishRetry is Publish with a Retry-After (seconds) for a terminal error.
func (p *Publisher) PublishRetry(ctx context.Context, kind Kind, status int, payload []byte, retryAfter int) error {
	c := newChunk(p.Next(), kind, status, payload, p.meta, retryAfter)
	if p.notice && c.Terminal() && c.Idx == 0 && p.heard(ctx, c) {
		p.expiring = true // nothing is left on the subject to discard
		p.next.Add(1)
		return nil
	}
	// An election's errors are retried with the same expected last sequence, so a retry can
	// never append a chunk twice. A try whose answer was lost may have landed all the same:
	// its retry is then refused as out of sequence, and the subject's last chunk tells
	// whether that was this chunk or a fence.
	msg := c.msg(p.subject)
	msg.Header.Set(hdrWriter, p.writer)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(p.lastSeq, 10))
	expiring := c.Terminal() && p.finalTTL > 0
	if expiring {
		msg.Header.Set(jetstream.MsgTTLHeader, p.finalTTL.String())
	}
	var seq uint64
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		ack, err := jspub.Publish(ctx, p.js.Conn(), msg)
		if err == nil {
			seq = ack.Sequence
			return nil
		}
		if !wrongLastSequence(err) {
			return err
		}
		landed, lerr := p.landed(ctx, c.Idx)
		if lerr != nil {
			return lerr
		}
		if landed == 0 {
			return fmt.Errorf("%w: %s", ErrFenced, p.subject)
		}
		seq = landed
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrFenced) {
			return err
		}
		return fmt.Errorf("jobs: publish chunk %d on %s: %w", c.Idx, p.subject, err)
	}
	p.lastSeq = seq
	p.expiring = expiring && c.Idx == 0
	p.next.Add(1)
	return nil
}

// noticeWait bounds the wait for a follower's answer to a notice before the outcome is stored
// as a terminal chunk instead.
const noticeWait = time.Second

// heard sends c as a notice and reports whether a follower answered it (each feed listening on
// the notice subject answers, Hub.OpenNonStream). A notice nobody answered is stored as the
// terminal chunk by the caller: on a cluster the follower's interest crosses the routes
// asynchronously, and under load it was seen to arrive after the outcome (about one notice in
// a thousand at a few hundred intents a second on three nodes): the worker's server knew of no
// subscriber ("no responders", at once) and the request waited for its idle check. A stored
// chunk reaches it through its node's tail. A follower that left has nobody to answer either,
// which costs the same stored chunk a cluster always wrote before.
func (p *Publisher) heard(ctx context.Context, c Chunk) bool {
	msg := c.msg(NoticeSubject(p.subject))
	if p.local != nil && p.local.Notice(p.subject, msg.Header, msg.Data) {
		// Copies followed on other nodes listen on the notice subject; one whose interest has
		// not reached this server yet reads the outcome from the record, as it would had
		// another follower answered first.
		_ = p.js.Conn().PublishMsg(msg)
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, noticeWait)
	defer cancel()
	_, err := p.js.Conn().RequestMsgWithContext(ctx, msg)
	return err == nil
}

// landed is the stream sequence of chunk idx if this publisher's chunk idx is the subject's
// last message, 0 if another writer's message is (a fence, or a second owner's chunk). A read that still shows this publisher's previous
// chunk came from a replica behind its leader: tried again (jsretry.Again).
func (p *Publisher) landed(ctx context.Context, idx int) (uint64, error) {
	st, err := p.js.Stream(ctx, ChunksStreamOf(partition.OfSubject(p.subject)))
	if err != nil {
		return 0, err
	}
	m, err := st.GetLastMsgForSubject(ctx, p.subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, jsretry.Again(fmt.Errorf("jobs: %s: a replica without its chunks yet", p.subject))
	}
	if err != nil {
		return 0, err
	}
	if m.Sequence == p.lastSeq {
		return 0, jsretry.Again(fmt.Errorf("jobs: %s: a replica still at sequence %d", p.subject, m.Sequence))
	}
	if c, derr := decodeChunk(m.Header, m.Data); derr == nil && c.Idx == idx && m.Header.Get(hdrWriter) == p.writer {
		return m.Sequence, nil
	}
	return 0, nil
}

func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// Announce writes the terminal chunk of epoch of key for an execution whose outcome is stored
// but whose own terminal chunk may never have been written (its worker died between the
// two, or NATS stayed unavailable past the retry window): followers end on it instead of
// waiting. It writes nothing when the subject already ends with a terminal chunk, and reports
// whether it wrote. A terminal chunk written twice is harmless: followers stop at the first.
func Announce(ctx context.Context, js jetstream.JetStream, key, jobID string, epoch int, c Chunk) (bool, error) {
	subject := ChunkSubject(key, jobID, epoch)
	st, err := js.Stream(ctx, ChunksStreamOf(partition.OfKey(key)))
	if err != nil {
		return false, fmt.Errorf("jobs: announce %s: %w", subject, err)
	}
	m, err := st.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return false, fmt.Errorf("jobs: announce %s: %w", subject, err)
	default:
		if last, derr := decodeChunk(m.Header, m.Data); derr == nil && last.Terminal() {
			return false, nil
		}
	}
	if err := terminate(ctx, js, subject, c); err != nil {
		return false, err
	}
	return true, nil
}

// Fence ends epoch of key for good: clients following it get a fence chunk and the old
// owner's next write is refused. It is written by whoever takes an execution over.
func Fence(ctx context.Context, js jetstream.JetStream, key, jobID string, epoch int) error {
	return Terminate(ctx, js, key, jobID, epoch, KindFence, 0, nil)
}

// Terminate writes a terminal chunk to epoch of key from outside its owner (a takeover or a
// cancellation); like a fence, it makes the owner's next write fail.
func Terminate(ctx context.Context, js jetstream.JetStream, key, jobID string, epoch int, kind Kind, status int, payload []byte) error {
	return terminate(ctx, js, ChunkSubject(key, jobID, epoch), Chunk{Kind: kind, Status: status, Payload: payload})
}

// terminate writes c as a terminal chunk from outside the epoch's owner (index -1). It is
// retried through an election: a terminal chunk written twice is harmless (followers stop at
// the first), one never written leaves the epoch's followers waiting. It is sent as a notice
// as well, for the followers of a non-stream execution, which listen there.
func terminate(ctx context.Context, js jetstream.JetStream, subject string, c Chunk) error {
	c.Idx = -1
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		_, err := jspub.Publish(ctx, js.Conn(), c.msg(subject))
		return err
	})
	if err != nil {
		return fmt.Errorf("jobs: terminate %s: %w", subject, err)
	}
	if err := js.Conn().PublishMsg(c.msg(NoticeSubject(subject))); err != nil {
		return fmt.Errorf("jobs: terminate %s: notice: %w", subject, err)
	}
	return nil
}
