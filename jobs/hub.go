package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/jsretry"
)

// ErrHubClosed is returned by a Hub (and its followers) after Close.
var ErrHubClosed = errors.New("jobs: hub closed")

// ErrHistoryLost is returned by a follower whose execution's first chunks are no longer in
// CHUNKS (an execution longer than the chunk retention).
var ErrHistoryLost = errors.New("jobs: chunk history no longer retained")

// Hub fans the chunks of an execution out to every local follower. Per node there is one
// source per execution (a core subscription for the request that created it, or one ordered
// consumer for joiners), never one JetStream consumer per HTTP client. The chunks of a live
// execution are kept in memory, so a follower attaching late replays from index 0 with no gap
// and no repeat at the join point.
//
// An ordered consumer lives no longer than its feed: when the feed ends (terminal chunk, last
// follower gone, error, Close) the hub deletes it from the server, because nats.go's Stop
// leaves it there for its inactive threshold and a stream holds at most 1,000 consumers by
// default. Deleting is preferred to using the core fast path everywhere: a joiner needs the
// history, and on an external cluster a core subscription may miss the terminal chunk.
type Hub struct {
	js       jetstream.JetStream
	nc       *nats.Conn
	coreFast bool
	notices  bool
	inactive time.Duration // the ordered consumers' InactiveThreshold
	log      zerolog.Logger

	mu     sync.Mutex
	feeds  map[string]*feed
	closed bool
	// deleting counts the goroutines stopping and deleting ended feeds' consumers; Close waits.
	// Add runs under mu as a feed ends, and Close ends every feed before it waits, so no Add
	// follows the Wait.
	deleting sync.WaitGroup
	// quit ends the retries of deletes that failed (Close closes it before it waits).
	quit chan struct{}
}

// orderedInactive is the InactiveThreshold of the hub's ordered consumers (nats.go's default
// is 5 minutes). It only matters for a consumer nothing deletes, one whose API node died:
// while its node lives, a consumer always has a pull request waiting and stays, and after a
// reconnect the ordered consumer recreates itself anyway. 5 s is the server's own default for
// ephemeral consumers: an orphan is gone within ~6 s (the server adds up to 1 s of jitter),
// so filling 1,000 consumers with orphans takes ~170 followed executions orphaned per second.
const orderedInactive = 5 * time.Second

// orderedHeartbeat is how often the server tells an idle follower's consumer it is alive. The
// consumer is recreated after two missed heartbeats, so this sets how long a follower is stuck
// when the server holding its consumer restarts: nats.go's default of 5 s made that ~10 s in
// the fault suite's soak. 2 s costs one small message per idle follower every 2 s.
const orderedHeartbeat = 2 * time.Second

// deleteTimeout bounds one try to delete an ended feed's consumer. A delete that fails (a
// leader election, a partition, a lost connection) is tried again for deleteRetryFor: the
// server does not always expire the consumer itself (the fault suite's row 3b found two
// consumers, with a 5 s inactive threshold, still on CHUNKS 14 minutes after a partition
// during which their deletes had timed out). A delete by name goes through the meta leader,
// which removes the consumer's assignment whatever its server's state.
const (
	deleteTimeout  = 5 * time.Second
	deleteRetryFor = 2 * time.Minute
	deleteBackoff  = time.Second
)

// HubOptions configures a Hub.
type HubOptions struct {
	// CoreFastPath lets Open use a core subscription registered before the job is published.
	// That is safe when the subscriber's server is the one the chunks are published on
	// (embedded mode); with an external cluster, interest propagates asynchronously, so Open
	// uses an ordered consumer instead.
	CoreFastPath bool
	// Notices lets OpenNonStream follow a non-stream execution by its notices alone (one core
	// subscription on NoticeSubject; the job says so, Job.Notice, and its outcome is never
	// stored in CHUNKS). Safe where CoreFastPath is: a notice reaches the subscriptions its
	// server has when it is published, and on one server the follower's precedes the job.
	Notices bool
	// InactiveThreshold is how long the server keeps an ordered consumer nothing reads
	// (0: orderedInactive).
	InactiveThreshold time.Duration
}

// NewHub makes a Hub on nc; the caller must use the same connection to submit jobs when
// CoreFastPath is set (so the subscription precedes the job on the wire).
func NewHub(nc *nats.Conn, js jetstream.JetStream, log zerolog.Logger, opts HubOptions) *Hub {
	inactive := opts.InactiveThreshold
	if inactive <= 0 {
		inactive = orderedInactive
	}
	return &Hub{nc: nc, js: js, coreFast: opts.CoreFastPath, notices: opts.Notices, inactive: inactive, log: log, feeds: make(map[string]*feed), quit: make(chan struct{})}
}

// source is where a feed reads an execution's chunks.
type source int

const (
	fromCore          source = iota // a core subscription on the chunk subject
	fromHistory                     // an ordered consumer: the subject's history, then live
	fromNotice                      // a core subscription on the notice subject only
	fromHistoryNotice               // fromHistory, and a core subscription on the notice subject
)

// Open registers interest in a new execution before its job is published.
func (h *Hub) Open(ctx context.Context, subject string) (*Follower, error) {
	if h.coreFast {
		return h.attach(ctx, subject, fromCore)
	}
	return h.attach(ctx, subject, fromHistory)
}

// OpenNonStream is Open for a new non-stream execution. With HubOptions.Notices it follows
// the execution's notices alone, and its job must say so (Job.Notice): the outcome, a fence or
// a cancellation arrive there, unstored. Without, it is Open.
func (h *Hub) OpenNonStream(ctx context.Context, subject string) (*Follower, error) {
	if h.notices {
		return h.attach(ctx, subject, fromNotice)
	}
	return h.Open(ctx, subject)
}

// Notices reports whether OpenNonStream follows notices (HubOptions.Notices): the jobs it
// follows must then say so (Job.Notice).
func (h *Hub) Notices() bool { return h.notices }

// Join follows an execution that may already have output: history from index 0, then live.
func (h *Hub) Join(ctx context.Context, subject string) (*Follower, error) {
	return h.attach(ctx, subject, fromHistory)
}

// JoinNonStream is Join for a non-stream execution, which also listens on its notice subject:
// its outcome may be announced there and never stored. An outcome announced before the
// subscription is not seen, so the caller reads the record once after this returns.
func (h *Hub) JoinNonStream(ctx context.Context, subject string) (*Follower, error) {
	return h.attach(ctx, subject, fromHistoryNotice)
}

func (h *Hub) attach(ctx context.Context, subject string, src source) (*Follower, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrHubClosed
	}
	f, ok := h.feeds[subject]
	if ok {
		f.mu.Lock()
		ok = !f.done // a feed that is ending is replaced, never joined
		f.mu.Unlock()
	}
	fresh := !ok
	if fresh {
		f = &feed{hub: h, subject: subject, followers: make(map[*Follower]struct{})}
		h.feeds[subject] = f
	}
	fl := &Follower{f: f, wake: make(chan struct{}, 1)}
	f.mu.Lock()
	f.followers[fl] = struct{}{}
	f.mu.Unlock()
	h.mu.Unlock()
	if fresh {
		// The source starts outside the hub lock (it is a round trip); followers that attach
		// meanwhile simply wait for chunks.
		var err error
		switch src {
		case fromCore:
			err = f.startCore(f.subject, &f.sub)
		case fromNotice:
			err = f.startCore(NoticeSubject(f.subject), &f.notice)
		case fromHistoryNotice:
			if err = f.startCore(NoticeSubject(f.subject), &f.notice); err == nil {
				err = f.startConsumer(ctx)
			}
		default:
			err = f.startConsumer(ctx)
		}
		if err != nil {
			f.finish(err)
			return nil, err
		}
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

// Close stops every source and wakes every follower with ErrHubClosed. A second Close does
// nothing.
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
	// Every feed is done now: a consumer created for one later is deleted by its creator.
	// Deletes still retrying give up (the server's inactive threshold remains).
	close(h.quit)
	h.deleting.Wait()
}

// release stops an ended feed's ordered consumer and deletes it from the server. It runs on
// its own goroutine: finish may run inside the consumer's callback, and Stop can wait for a
// reset in progress (nats.go holds the consumer's lock while a reset's create is tried, up to
// 10 s a try plus its backoff).
func (h *Hub) release(subject string, src orderedSource) {
	defer h.deleting.Done()
	h.stopOrdered(subject, src)
}

// orderedSource is a feed's ordered consumer, its consume loop, and the name prefix of every
// server consumer the loop creates (prefix_1, then prefix_2… after each reset).
type orderedSource struct {
	cons   jetstream.Consumer
	cc     jetstream.ConsumeContext
	prefix string
}

// stopOrdered ends the consume loop, then deletes the consumer it used last, by name: one API
// call, the common case. When that delete fails or finds the consumer gone, or the loop was
// reset (its consumer's serial is past 1: a reset deletes the consumer it replaces without
// waiting for the answer, and a reset's create whose answer was lost leaves one nobody was
// told of), every consumer with the source's prefix is swept instead, looking again with
// backoff (sweepPrefix).
func (h *Hub) stopOrdered(subject string, src orderedSource) {
	src.cc.Stop()
	<-src.cc.Closed()
	if info := src.cons.CachedInfo(); info != nil {
		ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
		err := h.js.DeleteConsumer(ctx, ChunksStream, info.Name)
		cancel()
		switch {
		case err == nil && info.Name == src.prefix+"_1":
			return
		case err == nil || errors.Is(err, jetstream.ErrConsumerNotFound):
			// Replaced by a reset, or already removed: a reset deletes the consumer before it
			// creates the next one (prefix_2), which may still be applied, so the prefix is
			// swept. CI saw a reset on a reconnect delete prefix_1 just before quorum was lost.
		default:
			h.log.Debug().Err(err).Str("subject", subject).Str("consumer", info.Name).
				Msg("deleting an ended feed's consumer failed; sweeping its prefix")
		}
	}
	h.sweepPrefix(subject, src.prefix)
}

// Active is the number of executions this hub follows (for metrics and tests).
func (h *Hub) Active() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.feeds)
}

type feed struct {
	hub     *Hub
	subject string

	mu        sync.Mutex
	chunks    []Chunk
	done      bool
	err       error // set with done when the feed ended without a terminal chunk
	followers map[*Follower]struct{}
	sub       *nats.Subscription // the chunk subject's (fromCore)
	notice    *nats.Subscription // the notice subject's (fromNotice, fromHistoryNotice)
	ordered   *orderedSource
}

// startCore subscribes on subject, a core subscription kept in *held (f.sub or f.notice).
func (f *feed) startCore(subject string, held **nats.Subscription) error {
	sub, err := f.hub.nc.Subscribe(subject, func(m *nats.Msg) { f.deliver(m.Header, m.Data) })
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

// startConsumer reads the subject's history and then live chunks through one ordered consumer.
// A creation that fails with an election's errors is tried again (jsretry). Each try names its
// consumers with a prefix of its own: a try whose create answer was lost leaves a consumer
// whose name nobody was told, and the prefix is how sweepPrefix finds it.
func (f *feed) startConsumer(ctx context.Context) error {
	var src orderedSource
	var failed []string // the prefixes of the tries that failed
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		prefix := NewID()
		cons, err := f.hub.js.OrderedConsumer(ctx, ChunksStream, jetstream.OrderedConsumerConfig{
			FilterSubjects:    []string{f.subject},
			DeliverPolicy:     jetstream.DeliverAllPolicy,
			InactiveThreshold: f.hub.inactive,
			NamePrefix:        prefix,
		})
		if err != nil {
			return err
		}
		cc, err := cons.Consume(func(m jetstream.Msg) { f.deliver(m.Headers(), m.Data()) },
			jetstream.PullHeartbeat(orderedHeartbeat))
		if err != nil {
			// Consume creates the server consumer before it fails on the first pull, or its
			// create was applied and the answer lost.
			failed = append(failed, prefix)
			return err
		}
		src = orderedSource{cons: cons, cc: cc, prefix: prefix}
		return nil
	})
	for _, prefix := range failed {
		f.hub.sweepPrefix(f.subject, prefix)
	}
	if err != nil {
		return fmt.Errorf("jobs: follow %s: %w", f.subject, err)
	}
	f.mu.Lock()
	if f.done { // finished while the consumer was being created: nobody else will delete it
		f.mu.Unlock()
		if f.hub.track() {
			go f.hub.release(f.subject, src)
		} else {
			f.hub.stopOrdered(f.subject, src)
		}
		return nil
	}
	f.ordered = &src
	f.mu.Unlock()
	return nil
}

// track counts one more goroutine deleting consumers (Close waits for it), unless the hub is
// closed.
func (h *Hub) track() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.deleting.Add(1)
	return true
}

// sweepPrefix deletes, on a goroutine Close waits for, every CHUNKS consumer named with prefix
// (a failed try's, or an ended feed's whose delete by name failed or whose loop was reset),
// looking again with backoff for deleteRetryFor, or until Close: a create
// whose answer was lost can still be applied after the first look (a partition's heal). In row
// 3b such a consumer, with a 5 s inactive threshold and never delivered to, was still on CHUNKS
// 100 s after the row ended. Without a goroutine (the hub closed) it looks once.
func (h *Hub) sweepPrefix(subject, prefix string) {
	if !h.track() {
		_ = deletePrefixed(h.js, prefix)
		return
	}
	go func() {
		defer h.deleting.Done()
		var err error
		giveUp := time.Now().Add(deleteRetryFor)
		for wait := deleteBackoff; ; wait = min(2*wait, 30*time.Second) {
			err = deletePrefixed(h.js, prefix)
			if time.Now().Add(wait).After(giveUp) {
				break
			}
			t := time.NewTimer(wait)
			select {
			case <-h.quit:
				t.Stop()
				return
			case <-t.C:
			}
		}
		if err != nil {
			h.log.Warn().Err(err).Str("subject", subject).Str("prefix", prefix).
				Msg("deleting the consumers of an ended or failed follow failed; the server will expire them after their inactive threshold")
		}
	}()
}

// deletePrefixed lists CHUNKS's consumers and deletes those named prefix_<serial>, within
// deleteTimeout.
func deletePrefixed(js jetstream.JetStream, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	st, err := js.Stream(ctx, ChunksStream)
	if err != nil {
		return err
	}
	names := st.ConsumerNames(ctx)
	var ours []string
	for n := range names.Name() {
		if strings.HasPrefix(n, prefix+"_") {
			ours = append(ours, n)
		}
	}
	if err := names.Err(); err != nil {
		return err
	}
	for _, n := range ours {
		if err := js.DeleteConsumer(ctx, ChunksStream, n); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return err
		}
	}
	return nil
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
	switch {
	case c.Kind == KindStored: // the outcome is in the record; the chunks may not hold all of it
		f.mu.Unlock()
		f.finish(ErrStored)
		return
	case c.Idx == -1 && c.Terminal(): // written by a taker or a canceller, not the owner
		c.Idx = len(f.chunks)
	case c.Idx < len(f.chunks):
		f.mu.Unlock()
		return // already have it (history overlapping live)
	case c.Idx > len(f.chunks):
		missing, fromStream := len(f.chunks), f.sub == nil
		f.mu.Unlock()
		if fromStream {
			// The stream no longer holds the start of this execution (its chunks outlived the
			// CHUNKS retention): end with an error rather than wait for what will never come.
			f.hub.log.Warn().Str("subject", f.subject).Int("want", missing).Int("got", c.Idx).Msg("chunk history lost")
			f.finish(ErrHistoryLost)
			return
		}
		// A gap on the core path (slow consumer or late interest): re-read from the stream.
		f.hub.log.Warn().Str("subject", f.subject).Int("want", missing).Int("got", c.Idx).Msg("chunk gap; re-reading from stream")
		f.recover()
		return
	}
	f.appendUnlock(c)
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

// recover replaces a core source with an ordered consumer; duplicates are skipped by index.
func (f *feed) recover() {
	f.mu.Lock()
	if f.done || f.sub == nil {
		f.mu.Unlock()
		return
	}
	sub := f.sub
	f.sub = nil
	f.mu.Unlock()
	_ = sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.startConsumer(ctx); err != nil {
		f.finish(err)
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

// finish ends the feed: no more chunks, the source stops (an ordered consumer is deleted),
// the hub forgets it.
func (f *feed) finish(err error) {
	h := f.hub
	// h.mu first, as attach: ending the feed, forgetting it and counting its consumer's
	// deletion are one step, so Close cannot miss a deletion.
	h.mu.Lock()
	f.mu.Lock()
	if f.done {
		f.mu.Unlock()
		h.mu.Unlock()
		return
	}
	f.done, f.err = true, err
	sub, notice, src := f.sub, f.notice, f.ordered
	f.sub, f.notice, f.ordered = nil, nil, nil
	f.wakeLocked()
	f.mu.Unlock()
	if h.feeds[f.subject] == f {
		delete(h.feeds, f.subject)
	}
	if src != nil {
		h.deleting.Add(1)
	}
	h.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
	}
	if notice != nil {
		_ = notice.Unsubscribe()
	}
	if src != nil {
		go h.release(f.subject, *src)
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
