package workers

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// holderPresent is how long a holder found present is not asked for again, however many
// copies of its executions arrive: at most one presence request per holder and second.
const holderPresent = time.Second

// maxHolderChecks bounds the holders remembered as present (a restarted node's pool has a new
// id; the old ones are forgotten once their time is over).
const maxHolderChecks = 256

// holderChecks are the presence checks of other pools that CheckHolder runs or ran.
type holderChecks struct {
	mu sync.Mutex
	m  map[string]*holderCheck // by worker id
}

type holderCheck struct {
	running      bool
	keys         map[string]struct{} // the executions that made it ask, while running
	presentUntil time.Time           // once it found the holder present
}

// CheckHolder asks at once whether the pool that holds key's execution rec (kv.Record.Worker,
// another node's) is still there, and takes the execution over when it is gone, with the
// others it knows of that pool (the sweep's takeover, Pool.takeOverFrom). A copy of the
// request has reached this node, or waited in silence on it (intent.HolderChecker): usually a
// client's retry after the holder's node died, which would otherwise wait for the next sweep
// (SweepEvery) and then the presence span. It returns at once: the check runs on a goroutine
// Run waits for. One check per holder runs at a time, and a holder found present is not asked
// again for holderPresent.
func (p *Pool) CheckHolder(key string, rec *kv.Record) {
	worker := rec.Worker
	if worker == "" || worker == p.opts.ID || rec.State != kv.Pending {
		return
	}
	now := time.Now()
	c := &p.holderChecks
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc := c.m[worker]; hc != nil {
		if hc.running {
			hc.keys[key] = struct{}{}
			return
		}
		if now.Before(hc.presentUntil) {
			return
		}
	}
	p.localMu.Lock()
	ctx := p.localCtx
	if ctx != nil {
		p.localWG.Add(1)
	}
	p.localMu.Unlock()
	if ctx == nil {
		return // not running, or stopping
	}
	if c.m == nil {
		c.m = map[string]*holderCheck{}
	}
	if len(c.m) >= maxHolderChecks {
		maps.DeleteFunc(c.m, func(_ string, hc *holderCheck) bool { return !hc.running && now.After(hc.presentUntil) })
	}
	hc := &holderCheck{running: true, keys: map[string]struct{}{key: {}}}
	c.m[worker] = hc
	go func() {
		defer p.localWG.Done()
		gone := jobs.PoolGone(ctx, p.js.Conn(), worker)
		c.mu.Lock()
		keys := hc.keys
		if gone {
			delete(c.m, worker)
		} else {
			hc.running, hc.keys, hc.presentUntil = false, nil, time.Now().Add(holderPresent)
		}
		c.mu.Unlock()
		if !gone {
			return
		}
		for _, o := range p.leases.Owned(p.opts.Now()) {
			if o.Worker == worker {
				keys[o.Key] = struct{}{}
			}
		}
		if _, err := p.takeOverAll(ctx, worker, slices.Sorted(maps.Keys(keys)), "a copy's check"); err != nil {
			p.opts.Log.Warn().Err(err).Str("gone_worker", worker).Msg("taking over the executions of a gone worker (the sweep tries again)")
		}
	}()
}
