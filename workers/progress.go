package workers

import (
	"context"
	"sync"
	"time"

	"github.com/oncegate/oncegate/kv"
)

// progressEvery is the least time between two progress writes of one execution: the status
// API follows the tokens of a stream at this rate, whatever the token rate.
const progressEvery = 250 * time.Millisecond

// progress is what the execution tells the status API while it runs (kv.ProgressStream):
// the attempt sent, the backend, when, and the tokens so far. It is written asynchronously at
// each send and then at most every progressEvery, never into the record: no request waits for
// it, and the record's revision chain (claim, renewals, outcome) keeps one writer.
type progress struct {
	mu      sync.Mutex
	cur     kv.Progress
	written time.Time // when cur was last published
	tokens  int       // the tokens cur was published with
}

// noteSent records that attempt number attempt (of this epoch) is being sent to backend, and
// publishes it at once: from now on the execution reads as running.
func (ex *execution) noteSent(backend string, attempt int) {
	ex.progress.mu.Lock()
	defer ex.progress.mu.Unlock()
	ex.progress.cur = kv.Progress{JobID: ex.job.ID, Epoch: ex.job.Epoch, Attempt: attempt, Backend: backend,
		Sent: ex.pool.opts.Now().UTC(), Tokens: int(ex.tokens.Load()), Worker: ex.pool.opts.ID}
	ex.publishProgressLocked()
}

// publishProgressLocked writes cur; the caller holds progress.mu.
func (ex *execution) publishProgressLocked() {
	if ex.unrecorded {
		return // nobody can ask for it: a local execution has no job the status API finds
	}
	p := &ex.progress
	p.written, p.tokens = time.Now(), p.cur.Tokens
	cur := p.cur
	if err := ex.pool.store.PutProgress(ex.job.Key, &cur); err != nil {
		ex.log.Debug().Err(err).Msg("publishing progress")
	}
}

// startProgress runs the loop that publishes the tokens so far (at most every progressEvery,
// and every kv.ProgressRefresh while nothing changes) until the returned stop is called.
func (ex *execution) startProgress(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ex.progress.mu.Lock()
			p := &ex.progress
			if p.cur.Attempt > 0 {
				p.cur.Tokens = int(ex.tokens.Load())
				if p.cur.Tokens != p.tokens || time.Since(p.written) >= kv.ProgressRefresh {
					ex.publishProgressLocked()
				}
			}
			ex.progress.mu.Unlock()
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
