package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/partition"
)

// ErrHubClosed is returned by a Hub (and its followers) after Close.
var ErrHubClosed = errors.New("jobs: hub closed")

// ErrHistoryLost is returned by a follower whose execution's first chunks are no longer in
// CHUNKS (an execution longer than the chunk retention).
var ErrHistoryLost = errors.New("jobs: chunk history no longer retained")

// Hub fans the chunks of an execution out to every local follower, with no JetStream consumer
// per execution or per follower. Live chunks come from one source per node: on one server, a
// core subscription per execution (made before its job is published, it misses nothing); on a
// cluster, the node's tail, one ordered consumer on all of CHUNKS made once, whose messages
// the hub hands to the feed of their subject (a core subscription's interest crosses the
// routes asynchronously, so on a cluster it can miss a chunk published on another node). A
// follower that joins an execution already under way reads its history (tryHistory) after
// its feed is registered, so each chunk is either in the history or arrives live; the
// chunks of a live execution are kept in memory, so a follower attaching late replays from
// index 0 with no gap and no repeat at the join point.
//
// On a cluster each consumer created or deleted is a meta-group change replicated to every
// server (notes: a cluster intent cost ten times a single node's while a consumer was made
// per execution); the tail is made once per hub, the history is two direct reads.
type Hub struct {
	js       jetstream.JetStream
	nc       *nats.Conn
	coreFast bool
	notices  bool
	inactive time.Duration // the tail's InactiveThreshold
	log      zerolog.Logger
	chunks   string // the CHUNKS copy of the hub's partition

	mu     sync.Mutex
	feeds  map[string]*feed
	closed bool
	// catching counts the goroutines reading a feed's missing chunks (catchUpLater); Add runs
	// under mu while the hub is open, so no Add follows Close's Wait. ctx ends them at Close.
	catching sync.WaitGroup
	ctx      context.Context
	cancel   context.CancelFunc

	tail tail // on a cluster (!coreFast)
}

// orderedInactive is the InactiveThreshold of the tail (nats.go's default is 5 minutes). It
// only matters for a tail nothing deletes, one whose API node died: while its node lives, the
// consumer always has a pull request waiting and stays, and after a reconnect the ordered
// consumer recreates itself anyway. 5 s is the server's own default for ephemeral consumers.
const orderedInactive = 5 * time.Second

// orderedHeartbeat is how often the server tells an idle tail it is alive. The consumer is
// recreated after two missed heartbeats, so this sets how long followers are stuck when the
// server holding the tail restarts: nats.go's default of 5 s made that ~10 s in the fault
// suite's soak. 2 s costs one small message per node every 2 s.
const orderedHeartbeat = 2 * time.Second

// deleteTimeout bounds the delete of the tail when the hub closes (the server expires it after
// its inactive threshold otherwise).
const deleteTimeout = 5 * time.Second

// HubOptions configures a Hub.
type HubOptions struct {
	// CoreFastPath makes each feed's live source a core subscription registered before the
	// job is published. That is safe when the subscriber's server is the one the chunks are
	// published on (embedded mode, one server); with a cluster, interest propagates
	// asynchronously, so the hub reads live chunks from its tail instead.
	CoreFastPath bool
	// Notices lets OpenNonStream follow a non-stream execution by its notices alone (one core
	// subscription on NoticeSubject; the job says so, Job.Notice, and its outcome is never
	// stored in CHUNKS). A notice reaches the subscriptions its server knows of when it is
	// published, and the feed answers it. On one server the follower's precedes the job, so
	// none is missed. On a cluster the follower's interest crosses the routes asynchronously,
	// and may not have reached the worker's server yet: a notice nobody answered is stored as
	// the terminal chunk (Publisher.SetNotice), which the node's tail carries to the feed.
	// That saves nearly every non-stream intent on a cluster a replicated CHUNKS write and its
	// delivery to every node's tail.
	Notices bool
	// InactiveThreshold is how long the server keeps a tail nothing reads (0: orderedInactive).
	InactiveThreshold time.Duration
	// Partition is the partition whose executions the hub follows (its tail reads that
	// partition's CHUNKS): a gateway has one hub per partition.
	Partition partition.P
}

// NewHub makes a Hub on nc; the caller must use the same connection to submit jobs when
// CoreFastPath is set (so the subscription precedes the job on the wire). Without it, the
// first feed starts the hub's tail.
func NewHub(nc *nats.Conn, js jetstream.JetStream, log zerolog.Logger, opts HubOptions) *Hub {
	inactive := opts.InactiveThreshold
	if inactive <= 0 {
		inactive = orderedInactive
	}
	h := &Hub{nc: nc, js: js, coreFast: opts.CoreFastPath, notices: opts.Notices, inactive: inactive, log: log, chunks: ChunksStreamOf(opts.Partition), feeds: make(map[string]*feed)}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.tail.hub = h
	return h
}

// Open registers interest in a new execution before its job is published.
func (h *Hub) Open(ctx context.Context, subject string) (*Follower, error) {
	return h.attach(ctx, subject, false, false)
}

// OpenNonStream is Open for a new non-stream execution. With HubOptions.Notices it follows
// the execution's notices alone, and its job must say so (Job.Notice): the outcome, a fence or
// a cancellation arrive there, unstored. Without, it is Open.
func (h *Hub) OpenNonStream(ctx context.Context, subject string) (*Follower, error) {
	if h.notices {
		return h.attachNotice(ctx, subject)
	}
	return h.Open(ctx, subject)
}

// OpenHeld is OpenNonStream for a new execution this node's workers run (a held job), whose
// outcome their publisher hands to this hub in process (Hub.Notice, Publisher.SetLocal). On a
// cluster it makes no notice subscription: its interest would cross the routes and back (two
// RS+ and two RS- per intent, issue 44), and a fence or a cancellation sent from another node
// is stored in CHUNKS as well as sent (terminate), so the node's tail carries it. On one
// server the subscription's interest stays on the server, and it is OpenNonStream.
func (h *Hub) OpenHeld(ctx context.Context, subject string) (*Follower, error) {
	if !h.notices || h.coreFast {
		return h.OpenNonStream(ctx, subject)
	}
	if err := h.tail.start(ctx); err != nil {
		return nil, err
	}
	fl, _, _, err := h.register(subject)
	return fl, err
}

// Notice hands a notice of the execution on subject (its chunk subject) to the feed this hub
// follows it with, as the feed's notice subscription would; false when it follows none.
func (h *Hub) Notice(subject string, hdr nats.Header, data []byte) bool {
	h.mu.Lock()
	f := h.feeds[subject]
	h.mu.Unlock()
	if f == nil {
		return false
	}
	f.mu.Lock()
	done := f.done
	f.mu.Unlock()
	if done {
		return false
	}
	f.deliver(hdr, data)
	return true
}

// Notices reports whether OpenNonStream follows notices (HubOptions.Notices): the jobs it
// follows must then say so (Job.Notice).
func (h *Hub) Notices() bool { return h.notices }

// Join follows an execution that may already have output: history from index 0, then live.
func (h *Hub) Join(ctx context.Context, subject string) (*Follower, error) {
	return h.attach(ctx, subject, true, false)
}

// JoinNonStream is Join for a non-stream execution, which also listens on its notice subject:
// its outcome may be announced there and never stored. An outcome announced before the
// subscription is not seen, so the caller reads the record once after this returns.
func (h *Hub) JoinNonStream(ctx context.Context, subject string) (*Follower, error) {
	return h.attach(ctx, subject, true, true)
}

// register adds a follower to subject's feed, making the feed when there is none (or only one
// that is ending, which is replaced, never joined); fresh says it was made.
func (h *Hub) register(subject string) (fl *Follower, f *feed, fresh bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, false, ErrHubClosed
	}
	f, ok := h.feeds[subject]
	if ok {
		f.mu.Lock()
		ok = !f.done
		f.mu.Unlock()
	}
	if !ok {
		f = &feed{hub: h, subject: subject, followers: make(map[*Follower]struct{})}
		h.feeds[subject] = f
	}
	fl = &Follower{f: f, wake: make(chan struct{}, 1)}
	f.mu.Lock()
	f.followers[fl] = struct{}{}
	f.mu.Unlock()
	return fl, f, !ok, nil
}

// attachNotice follows a new non-stream execution by its notices alone, and on a cluster by
// the hub's tail as well, which carries the outcome a notice nobody answered was stored as.
func (h *Hub) attachNotice(ctx context.Context, subject string) (*Follower, error) {
	if !h.coreFast {
		if err := h.tail.start(ctx); err != nil {
			return nil, err
		}
	}
	fl, f, fresh, err := h.register(subject)
	if err != nil || !fresh {
		return fl, err
	}
	if err := f.startCore(NoticeSubject(subject), &f.notice); err != nil {
		f.finish(err)
		return nil, err
	}
	return fl, nil
}

// attach registers a follower of subject. A fresh feed starts its live source (a core
// subscription, or the tail), plus one on the notice subject when notice is set, and when
// join is set reads the subject's history: the live source first, so that every chunk is in
// the history or arrives live. Followers that attach meanwhile wait for chunks.
func (h *Hub) attach(ctx context.Context, subject string, join, notice bool) (*Follower, error) {
	if !h.coreFast {
		if err := h.tail.start(ctx); err != nil {
			return nil, err
		}
	}
	fl, f, fresh, err := h.register(subject)
	if err != nil || !fresh {
		return fl, err
	}
	if join {
		f.mu.Lock()
		f.joining = true
		f.mu.Unlock()
	}
	if notice {
		err = f.startCore(NoticeSubject(subject), &f.notice)
	}
	if err == nil && h.coreFast {
		err = f.startCore(subject, &f.sub)
	}
	if err == nil && join {
		err = f.catchUp(ctx)
	}
	if err != nil {
		f.finish(err)
		return nil, err
	}
	return fl, nil
}

// JoinLive attaches a follower to subject only if this hub already follows it (its feed is
// open and has not ended), without any JetStream call; ok is false otherwise. The follower
// replays the feed's chunks from index 0, as Join's does.
func (h *Hub) JoinLive(subject string) (*Follower, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, ok := h.feeds[subject]
	if !ok || h.closed {
		return nil, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return nil, false
	}
	fl := &Follower{f: f, wake: make(chan struct{}, 1)}
	f.followers[fl] = struct{}{}
	return fl, true
}

// Following reports whether this hub follows subject now.
func (h *Hub) Following(subject string) bool {
	h.mu.Lock()
	f, ok := h.feeds[subject]
	h.mu.Unlock()
	if !ok {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.done
}

// Close stops every source and wakes every follower with ErrHubClosed; the tail's consumer
// is deleted. A second Close does nothing.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	feeds := make([]*feed, 0, len(h.feeds))
	for _, f := range h.feeds {
		feeds = append(feeds, f)
	}
	h.feeds = map[string]*feed{}
	h.mu.Unlock()
	for _, f := range feeds {
		f.finish(ErrHubClosed)
	}
	h.cancel()
	h.catching.Wait()
	h.tail.stop()
}

// Active is the number of executions this hub follows (for metrics and tests).
func (h *Hub) Active() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.feeds)
}

// route hands a chunk the tail read to its subject's feed; a chunk nobody here follows is
// dropped (it is in CHUNKS for a follower that joins later).
func (h *Hub) route(subject string, hdr nats.Header, data []byte) {
	h.mu.Lock()
	f := h.feeds[subject]
	h.mu.Unlock()
	if f != nil {
		f.deliver(hdr, data)
	}
}

// endStreamed ends every feed that reads from CHUNKS (not Hub.Local's) with err: its chunks
// will not come (the stream was lost with its servers).
func (h *Hub) endStreamed(err error) {
	h.mu.Lock()
	var ended []*feed
	for _, f := range h.feeds {
		if !f.local {
			ended = append(ended, f)
		}
	}
	h.mu.Unlock()
	for _, f := range ended {
		f.finish(err)
	}
}

type feed struct {
	hub     *Hub
	subject string
	local   bool // Hub.Local's: written in this process, never in CHUNKS

	mu     sync.Mutex
	chunks []Chunk
	// joining is set while the feed reads its history (catchUp); live chunks past the next
	// index wait in early meanwhile.
	joining   bool
	early     []Chunk
	done      bool
	err       error // set with done when the feed ended without a terminal chunk
	followers map[*Follower]struct{}
	sub       *nats.Subscription // the chunk subject's (CoreFastPath)
	notice    *nats.Subscription // the notice subject's (OpenNonStream with notices, JoinNonStream)
}

// startCore subscribes on subject, a core subscription kept in *held (f.sub or f.notice). A
// notice sent as a request (Publisher's) is answered once delivered: its worker then stores
// nothing. A chunk's publish on f.sub is JetStream's to answer, never the feed's.
func (f *feed) startCore(subject string, held **nats.Subscription) error {
	answer := held == &f.notice
	sub, err := f.hub.nc.Subscribe(subject, func(m *nats.Msg) {
		f.deliver(m.Header, m.Data)
		if answer && m.Reply != "" {
			_ = m.Respond(nil)
		}
	})
	if err != nil {
		return fmt.Errorf("jobs: subscribe %s: %w", subject, err)
	}
	_ = sub.SetPendingLimits(-1, -1) // a slow reader must not make the client drop chunks
	f.mu.Lock()
	if f.done {
		f.mu.Unlock()
		_ = sub.Unsubscribe()
		return nil
	}
	*held = sub
	f.mu.Unlock()
	return nil
}

// catchUp reads the subject's history into the feed (f.joining is set, and the live source
// runs): the chunks before the first one the feed holds, then the ones that came live while
// it read. A history that does not start at index 0, or has a hole, lost its start to the
// CHUNKS retention: the feed ends with ErrHistoryLost rather than wait for what will never
// come.
func (f *feed) catchUp(ctx context.Context) error {
	past, err := history(ctx, f.hub.nc, f.subject, !f.hub.coreFast)
	if err != nil {
		return err
	}
	f.mu.Lock()
	if f.done {
		f.mu.Unlock()
		return nil
	}
	pending := append(past, f.early...)
	f.joining, f.early = false, nil
	for _, c := range pending {
		switch place(&c, len(f.chunks)) {
		case placeStored:
			f.mu.Unlock()
			f.finish(ErrStored)
			return nil
		case placeHave:
			continue
		case placeAhead:
			missing := len(f.chunks)
			f.mu.Unlock()
			f.hub.log.Warn().Str("subject", f.subject).Int("want", missing).Int("got", c.Idx).Msg("chunk history lost")
			f.finish(ErrHistoryLost)
			return nil
		}
		c.shared = &derived{}
		f.chunks = append(f.chunks, c)
		if c.Terminal() {
			f.wakeLocked()
			f.mu.Unlock()
			f.finish(nil)
			return nil
		}
	}
	f.wakeLocked()
	f.mu.Unlock()
	return nil
}

// placement is what a feed that holds n chunks does with a chunk (place).
type placement int

const (
	placeNext   placement = iota // the feed's next chunk
	placeHave                    // held already (history overlapping live)
	placeAhead                   // chunks before it are missing
	placeStored                  // KindStored: the outcome is in the record, the chunks may not hold all of it
)

// place says where c goes in a feed holding n chunks; a terminal chunk with index -1, written
// by a taker or a canceller and not the owner, becomes the next one (c.Idx is set).
func place(c *Chunk, n int) placement {
	switch {
	case c.Kind == KindStored:
		return placeStored
	case c.Idx == -1 && c.Terminal():
		c.Idx = n
	case c.Idx < n:
		return placeHave
	case c.Idx > n:
		return placeAhead
	}
	return placeNext
}

func (f *feed) deliver(h nats.Header, data []byte) {
	c, err := decodeChunk(h, data)
	if err != nil {
		f.hub.log.Warn().Err(err).Str("subject", f.subject).Msg("dropping malformed chunk")
		return
	}
	f.mu.Lock()
	if f.done {
		f.mu.Unlock()
		return
	}
	if f.joining && c.Kind != KindStored && (c.Idx > len(f.chunks) || c.Idx == -1) {
		f.early = append(f.early, c) // after the history (catchUp)
		f.mu.Unlock()
		return
	}
	switch place(&c, len(f.chunks)) {
	case placeStored:
		f.mu.Unlock()
		f.finish(ErrStored)
		return
	case placeHave:
		f.mu.Unlock()
		return
	case placeAhead:
		// A gap on a core subscription (a slow consumer); or on the tail, whose chunks come
		// in stream order, chunks that came before the feed (it was opened after its job
		// was published): read what is missing from the stream.
		missing := len(f.chunks)
		f.joining, f.early = true, append(f.early, c)
		f.mu.Unlock()
		f.hub.log.Warn().Str("subject", f.subject).Int("want", missing).Int("got", c.Idx).Msg("chunk gap; reading the stream")
		f.hub.catchUpLater(f)
		return
	}
	f.appendUnlock(c)
}

// catchUpLater reads a feed's missing chunks on a goroutine the hub owns (Close waits for
// it): the callback that found the gap, the tail's for every feed of the node, must not wait
// for a stream read.
func (h *Hub) catchUpLater(f *feed) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.catching.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.catching.Done()
		ctx, cancel := context.WithTimeout(h.ctx, jsretry.Window)
		defer cancel()
		if err := f.catchUp(ctx); err != nil {
			f.finish(err)
		}
	}()
}

// appendUnlock adds c, the feed's next chunk, wakes the followers and releases f.mu (held by
// the caller); a terminal chunk ends the feed.
func (f *feed) appendUnlock(c Chunk) {
	c.shared = &derived{}
	f.chunks = append(f.chunks, c)
	terminal := c.Terminal()
	f.wakeLocked()
	f.mu.Unlock()
	if terminal {
		f.finish(nil)
	}
}

func (f *feed) wakeLocked() {
	for fl := range f.followers {
		select {
		case fl.wake <- struct{}{}:
		default:
		}
	}
}

// finish ends the feed: no more chunks, its subscriptions stop, the hub forgets it.
func (f *feed) finish(err error) {
	h := f.hub
	h.mu.Lock()
	f.mu.Lock()
	if f.done {
		f.mu.Unlock()
		h.mu.Unlock()
		return
	}
	f.done, f.err = true, err
	sub, notice := f.sub, f.notice
	f.sub, f.notice, f.early = nil, nil, nil
	f.wakeLocked()
	f.mu.Unlock()
	if h.feeds[f.subject] == f {
		delete(h.feeds, f.subject)
	}
	h.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	if notice != nil {
		_ = notice.Unsubscribe()
	}
}

// Follower reads one execution's chunks in order from index 0. Not safe for concurrent use.
type Follower struct {
	f    *feed
	pos  int
	wake chan struct{}
}

// ErrEnded is returned by Next when the feed ended without a terminal chunk.
var ErrEnded = errors.New("jobs: execution feed ended")

// ErrStored is returned by Next after a KindStored chunk: the outcome is in the record, and
// the chunks may not hold all of it. It is an ErrEnded, so whoever reads the record when a
// feed ends does so here too.
var ErrStored = fmt.Errorf("%w: the outcome is stored in the record", ErrEnded)

// Next returns the next chunk, waiting for it until ctx ends. After a terminal chunk the
// follower has nothing more; calling Next again returns ErrEnded.
func (fl *Follower) Next(ctx context.Context) (Chunk, error) {
	c, _, err := fl.NextOr(ctx, nil)
	return c, err
}

// NextOr is Next that also gives up, with ok false and no error, when alarm fires first (a
// reusable timer for heartbeats, cheaper per chunk than a context with a timeout).
func (fl *Follower) NextOr(ctx context.Context, alarm <-chan time.Time) (c Chunk, ok bool, err error) {
	for {
		fl.f.mu.Lock()
		if fl.pos < len(fl.f.chunks) {
			c := fl.f.chunks[fl.pos]
			fl.pos++
			fl.f.mu.Unlock()
			return c, true, nil
		}
		done, err := fl.f.done, fl.f.err
		fl.f.mu.Unlock()
		if done {
			if err != nil {
				return Chunk{}, false, err
			}
			return Chunk{}, false, ErrEnded
		}
		select {
		case <-fl.wake:
		case <-alarm:
			return Chunk{}, false, nil
		case <-ctx.Done():
			return Chunk{}, false, ctx.Err()
		}
	}
}

// Ready reports whether Next would return a chunk at once (the follower is behind the feed).
func (fl *Follower) Ready() bool {
	fl.f.mu.Lock()
	defer fl.f.mu.Unlock()
	return fl.pos < len(fl.f.chunks)
}

// EndStored ends the feed fl follows with ErrStored, as a KindStored chunk would: its caller
// read the record after JoinNonStream and found the execution ended (or moved to another
// epoch), whose notice may have gone before the subscription. Chunks already received stay
// readable; every follower of the feed then reads the record.
func (fl *Follower) EndStored() { fl.f.finish(ErrStored) }

// Close detaches the follower; the last follower of an unfinished feed stops its source.
func (fl *Follower) Close() {
	f := fl.f
	f.mu.Lock()
	delete(f.followers, fl)
	last := len(f.followers) == 0 && !f.done
	f.mu.Unlock()
	if last {
		f.finish(ErrEnded)
	}
}
