package workers

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// A killed worker's executions are taken over in seconds, not after their lease. Two parts:
//
//   - JOBS redelivers a job whose holder stopped acking after ackWait (2 s), not after the
//     lease: every execution's job message is kept in progress every ackWait/4 (heartbeat), a
//     core publish that stores nothing.
//   - The redelivery finds the record PENDING with its lease running. Its owner (the pool the
//     record's renewal or the epoch's progress names) is asked for over core NATS
//     (jobs.PoolGone): gone, the execution is taken over at once, with the owner's sent
//     attempts counted from its progress. Present, slow or unknown, the lease decides as before.

// maxAckWait bounds the JOBS consumer's AckWait: how long a dead holder's job waits for its
// redelivery.
const maxAckWait = 2 * time.Second

// ackWait is the JOBS consumer's AckWait for a lease: maxAckWait, or the lease if shorter.
func ackWait(lease time.Duration) time.Duration { return min(lease, maxAckWait) }

// heartbeatLoop keeps the job message of every execution of the pool in progress, every
// ackWait/4, until ctx ends.
func (p *Pool) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(ackWait(p.opts.Lease) / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.noHeartbeat {
			continue
		}
		p.inflight.mu.Lock()
		for ex := range p.inflight.running {
			_ = ex.msg.InProgress() // a settled message refuses it: harmless
		}
		p.inflight.mu.Unlock()
	}
}

// ownerGone reports whether the pool that owns rec's epoch (the renewal's worker, else the
// epoch's progress's) is gone (jobs.PoolGone), so its execution may be taken over before its
// lease runs out. An owner not known (nothing sent, nothing renewed yet), or this pool, is
// never gone: the lease decides.
func (p *Pool) ownerGone(ctx context.Context, key string, rec *kv.Record) (owner string, gone bool) {
	owner = rec.Worker
	if owner == "" {
		if pr, err := p.store.Progress(ctx, rec.JobID, rec.Epoch); err == nil && pr.Key == key {
			owner = pr.Worker
		}
	}
	if owner == "" || owner == p.opts.ID {
		return owner, false
	}
	return owner, jobs.PoolGone(ctx, p.js.Conn(), owner)
}
