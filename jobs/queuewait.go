package jobs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/partition"
)

// QueueWatch samples how long the job at the head of the JOBS queue has waited: the age of
// the oldest job the workers' consumer has not handed to any worker yet. That is the queue
// time the next new intent would add to its answer, for the whole cluster (every worker pulls
// from the one queue), read with one consumer info request and, when jobs wait, one message
// read per sample. An API node sheds new intents while it is over a bound (intent's
// MaxQueueWait). Safe for concurrent use; Run's goroutine belongs to the caller.
//
// It samples only while the answer can matter (issue 44: an idle node asks JetStream
// nothing): while Wait was asked within askedFor, or the last sample found jobs waiting. The
// first Wait after a quiet spell gets the last sample (an empty queue: nothing was admitted
// here since, and every other node sheds on its own samples) and wakes the sampling at once.
type QueueWatch struct {
	js       jetstream.JetStream
	part     partition.P
	consumer string
	every    time.Duration
	log      zerolog.Logger
	now      func() time.Time

	wait atomic.Int64 // nanoseconds, the last sample's head wait
	// asked is when Wait was last called (unix nanoseconds); wake wakes a sleeping Run.
	asked atomic.Int64
	wake  chan struct{}

	mu sync.Mutex
	st jetstream.Stream // JOBS, once looked up (a handle stays valid when the stream is recreated)
}

// NewQueueWatch watches the JOBS queue of the durable consumer named consumer, sampling
// every interval once Run runs.
// It watches partition p's JOBS.
func NewQueueWatch(js jetstream.JetStream, p partition.P, consumer string, every time.Duration, log zerolog.Logger) *QueueWatch {
	return &QueueWatch{js: js, part: p, consumer: consumer, every: every, log: log, now: time.Now, wake: make(chan struct{}, 1)}
}

// askedFor is how long after the last Wait the watch keeps sampling an empty queue.
const askedFor = time.Second

// Wait is the head job's wait at the last sample: 0 when the queue was empty, before the
// first sample, or when the last sample could not be read. It keeps the sampling going.
func (q *QueueWatch) Wait() time.Duration {
	q.asked.Store(q.now().UnixNano())
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return time.Duration(q.wait.Load())
}

// Run samples every interval while the answer can matter (see QueueWatch) until ctx ends.
func (q *QueueWatch) Run(ctx context.Context) {
	t := time.NewTicker(q.every)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, q.every)
		wait, pending, err := q.Read(sctx)
		cancel()
		switch {
		case err == nil:
			q.wait.Store(int64(wait))
		case ctx.Err() == nil:
			// NATS cannot be read: new intents fail on their own writes, so no shedding is
			// needed to protect anything; do not keep a stale wait that would shed after it.
			q.wait.Store(0)
			q.log.Debug().Err(err).Msg("reading the JOBS queue's head")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if pending > 0 || q.now().Sub(time.Unix(0, q.asked.Load())) < askedFor {
			continue
		}
		select { // quiet: nothing waits and nobody asks; sleep until Wait is called
		case <-ctx.Done():
			return
		case <-q.wake:
		}
	}
}

// Read reads the head job's wait and the jobs pending now.
func (q *QueueWatch) Read(ctx context.Context) (time.Duration, uint64, error) {
	c, err := q.js.Consumer(ctx, JobsStreamOf(q.part), q.consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, 0, nil // no worker has started yet (or NATS lost the memory stream): no queue to measure
	}
	if err != nil {
		return 0, 0, fmt.Errorf("jobs: queue: %w", err)
	}
	info := c.CachedInfo()
	if info.NumPending == 0 {
		return 0, 0, nil
	}
	st, err := q.stream(ctx)
	if err != nil {
		return 0, 0, err
	}
	m, err := st.GetMsg(ctx, info.Delivered.Stream+1, jetstream.WithGetMsgSubject(JobsSubjectsOf(q.part)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, info.NumPending, nil // delivered meanwhile
	}
	if err != nil {
		return 0, 0, fmt.Errorf("jobs: queue head: %w", err)
	}
	return max(q.now().Sub(m.Time), 0), info.NumPending, nil
}

func (q *QueueWatch) stream(ctx context.Context) (jetstream.Stream, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.st != nil {
		return q.st, nil
	}
	st, err := q.js.Stream(ctx, JobsStreamOf(q.part))
	if err != nil {
		return nil, fmt.Errorf("jobs: queue: %w", err)
	}
	q.st = st
	return st, nil
}
