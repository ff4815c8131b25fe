package intent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/kv"
)

// A refusal is an admission's write (a claim, a reclaim) that ended in jsretry.ErrUnavailable:
// its request was answered 503, and the write may all the same have reached a server that
// stores it later. Most such late writes carry a stored time past their AdmitBy, and the lease
// sweep releases them (ReleaseRefused). One kind does not: a proposal the stream's leader took
// in time and that its Raft group commits only after the API gave up (a leader that lost its
// quorum keeps what it was sent, and commits it when it leads again). This node remembers its
// refusals and, once the store answers, releases any that landed: it runs long before the sweep
// could re-drive one, which waits for a lease on a bucket that has been steady for a lease.
type refusal struct {
	owner string
	epoch int
	// until is when this node stops looking: by then the sweep has had its chance, and a
	// claim still absent is not coming.
	until time.Time
}

// maxRefusals bounds the refusals remembered; past it the oldest still waiting are kept and a
// new one is left to the sweep's AdmitBy rule (logged).
const maxRefusals = 10_000

// refusalEvery is how often RunRefusals reads the refusals' keys.
const refusalEvery = time.Second

type refusals struct {
	mu sync.Mutex
	m  map[string]refusal
}

// noteRefused remembers rec, the admission's write for key that err ended, when err leaves its
// outcome unknown.
func (c *Core) noteRefused(key string, rec *kv.Record, err error) {
	if !errors.Is(err, jsretry.ErrUnavailable) {
		return
	}
	c.refused.mu.Lock()
	defer c.refused.mu.Unlock()
	if c.refused.m == nil {
		c.refused.m = map[string]refusal{}
	}
	if len(c.refused.m) >= maxRefusals {
		c.log.Warn().Str(fieldKey, key).Msg("too many refused claims to watch: this one is left to the lease sweep")
		return
	}
	c.refused.m[key] = refusal{owner: rec.Owner, epoch: rec.Epoch, until: rec.AdmitBy.Add(2*c.opts.Lease + jsretry.Window)}
}

// RunRefusals releases, until ctx ends, the refused admissions' writes that the store took
// after all (see refusal): every second it reads each remembered key, and a record still as
// that refusal wrote it (its owner nonce and epoch, PENDING, never launched) is released
// (FAILED, retryable), so no execution starts from it.
func (c *Core) RunRefusals(ctx context.Context) {
	t := time.NewTicker(refusalEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.releaseRefusals(ctx)
	}
}

// releaseRefusals is one pass of RunRefusals.
func (c *Core) releaseRefusals(ctx context.Context) {
	c.refused.mu.Lock()
	keys := make(map[string]refusal, len(c.refused.m))
	for k, r := range c.refused.m {
		keys[k] = r
	}
	c.refused.mu.Unlock()
	now := c.now()
	for key, r := range keys {
		if ctx.Err() != nil {
			return
		}
		done := now.After(r.until)
		tctx, cancel := context.WithTimeout(ctx, jsretry.PerTry)
		rec, rev, err := c.storeOf(key).Get(tctx, key)
		switch {
		case errors.Is(err, jsretry.ErrUnavailable):
			cancel()
			return // the store is still out: the next pass reads again (one wait a pass, not one a key)
		case err != nil:
			// Not there (yet): a late commit may still come until r.until.
		case rec.Owner != r.owner || rec.Epoch != r.epoch || rec.State != kv.Pending || rec.AdmitBy.IsZero():
			done = true // another admission's record, or ours moved on (it was never launched: only the sweep moves it)
		default:
			if releaseRefused(tctx, c.storeOf(key), key, rec, rev) == nil {
				c.log.Warn().Str(fieldKey, key).Int("epoch", rec.Epoch).Time("admit_by", rec.AdmitBy).
					Msg("a claim stored after its request was refused (503): released, not executed")
				done = true
			}
		}
		cancel()
		if done {
			c.refused.mu.Lock()
			if cur, ok := c.refused.m[key]; ok && cur == r {
				delete(c.refused.m, key)
			}
			c.refused.mu.Unlock()
		}
	}
}
