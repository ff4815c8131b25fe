package workers

import (
	"context"
	"errors"
	"time"

	"github.com/oncegate/oncegate/kv"
)

// The charge sweep makes true what DESIGN promises of the ledger: a sweep catches any charge a
// crash skipped, whoever finished the record. A worker charges the outcome it stored right
// after storing it; if it dies in between, its job message is redelivered and the next worker
// charges (handle), but not when that message is gone too (JOBS is a memory stream) or the
// ledger write failed. So every sweep also takes, from the pool's LeaseWatch (which already
// reads each record written since the last sweep, headers only), the billable records
// (kv.Record.Billable) written more than ChargeGrace ago, reads each and charges it with
// repeat semantics: entry ids are deterministic and looked up first, so a charge that exists
// is not written again.
//
// Cost: the records this pool charged itself (noteCharged) are skipped with no read, and so
// are those another pool stored while that pool still runs (Options.Running: its status posts
// are seen); each other billable record costs one record read and one ledger id lookup (in
// memory within the ledger's dedup horizon) per pool. What that leaves open: a pool whose own
// charge failed (the ledger had no leader for longer than the charge's retries) and that dies
// after the other pools' sweeps saw it running but before its own sweep charged the record
// (a double fault: that charge is missing; docs/operations/availability.md). The watch holds at most one ChargeGrace + SweepEvery of
// billable records (kv.LeaseWatch.Billable); after a restart, those written in the last
// kv.BillableWindow.

// chargedAt is a record revision this pool charged, and when.
type chargedAt struct {
	rev uint64
	at  time.Time
}

// noteCharged remembers that the record of key at rev was charged by this pool.
func (p *Pool) noteCharged(key string, rev uint64) {
	if p.opts.SweepEvery < 0 {
		return // no sweep will ever take it out
	}
	p.chargedMu.Lock()
	p.charged[key] = chargedAt{rev: rev, at: time.Now()}
	p.chargedMu.Unlock()
}

// selfCharged reports (and forgets) whether this pool charged key at rev.
func (p *Pool) selfCharged(key string, rev uint64) bool {
	p.chargedMu.Lock()
	defer p.chargedMu.Unlock()
	c, ok := p.charged[key]
	if ok && c.rev == rev {
		delete(p.charged, key)
		return true
	}
	return false
}

// forgetCharged drops what the sweep can no longer ask about (records it will not see again).
func (p *Pool) forgetCharged(before time.Time) {
	p.chargedMu.Lock()
	defer p.chargedMu.Unlock()
	for key, c := range p.charged {
		if c.at.Before(before) {
			delete(p.charged, key)
		}
	}
}

// sweepCharges charges every billable record the watch saw written before now-ChargeGrace
// that this pool did not charge itself. It returns how many records it read.
func (p *Pool) sweepCharges(ctx context.Context, now time.Time) int {
	if p.opts.Ledger == nil {
		return 0
	}
	due, dropped := p.leases.Billable(now.Add(-p.opts.ChargeGrace))
	if dropped > 0 {
		p.opts.Log.Error().Int("records", dropped).Msg("charge sweep: too many billable records waiting; these are left to their job's redelivery")
	}
	read := 0
	for _, f := range due {
		if ctx.Err() != nil {
			p.leases.Requeue(f)
			continue
		}
		if p.selfCharged(f.Key, f.Rev) {
			continue
		}
		if f.Worker != "" && f.Worker != p.opts.ID && p.opts.Running != nil && p.opts.Running(f.Worker) {
			continue // its own pool runs, and charges it (or sweeps it itself)
		}
		rec, rev, err := p.store.Get(ctx, f.Key)
		if errors.Is(err, kv.ErrNotFound) {
			continue // expired or deleted: nothing left to charge from
		}
		if err != nil {
			p.opts.Log.Warn().Err(err).Str(fieldKey, f.Key).Msg("charge sweep: reading record; will retry")
			p.leases.Requeue(f)
			continue
		}
		read++
		if !p.charge(ctx, f.Key, rec, rev, nil, true) {
			p.leases.Requeue(f)
		}
	}
	p.forgetCharged(time.Now().Add(-10 * (p.opts.ChargeGrace + max(p.opts.SweepEvery, 0))))
	return read
}

// chargeCancelled charges a record that DELETE /v1/jobs/{id} cancelled while this execution
// ran (its writes were just refused): the cancel recorded this epoch's attempts as unfinished
// (kv.Unfinished), which the backend may have billed. Charging at once saves the tenant's
// budget from waiting for the sweep, which would charge it too (the same entry id).
func (ex *execution) chargeCancelled() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, rev, err := ex.pool.store.Get(ctx, ex.job.Key)
	if err != nil || rec.JobID != ex.job.ID || rec.Epoch != ex.job.Epoch || !rec.Cancelled {
		return
	}
	if ex.pool.charge(ctx, ex.job.Key, rec, rev, ex.job.Body, false) {
		ex.pool.noteCharged(ex.job.Key, rev)
	}
}
