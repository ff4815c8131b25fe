package intent

import (
	"context"
	"errors"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// A bypassed request (X-Allow-Duplicate, or a route's dedup off) executes every time: that is
// what its client asked for. But an official SDK retries a request that timed out, and that
// retry executed again too (issue 34: 48-65 duplicate executions per 10,000 intents, in every
// run, from bypassed requests alone). The SDK says which attempt a request is
// (x-stainless-retry-count: 0, 1, 2): so a bypassed request whose client sent that count
// (Request.ContentKey set) is listed among its content's recent executions (kv.Recent), and a
// retry of it (count ≥ 1) joins the execution of its content started within
// bypassRetryWindow when there is exactly one. When there are two or more, the client sent
// the same content twice on purpose, and which one the retry continues cannot be told: it
// executes, as the header asks (a false merge would give two intents one answer).
//
// A bypass without the retry count runs as before: on this node's workers if it can, with no
// record; a listed one needs a record to be joined, so it takes the job path, and its listing
// costs a read and a synced write.

// bypassRetryWindow is how long after its start a listed execution can be joined by a retry:
// the official SDKs' default timeout is 10 minutes, and they retry after it.
const bypassRetryWindow = 10 * time.Minute

// bypass admits a bypassed request.
func (c *Core) bypass(ctx context.Context, req *Request) (*Admission, error) {
	if req.ContentKey != "" && req.Retry {
		if adm, ok, err := c.joinRetriedBypass(ctx, req); ok {
			return adm, err
		}
	}
	jobID := jobs.NewID()
	key := HashParts(req.Tenant, "bypass", jobID) // unique per execution, whatever the key
	if req.ContentKey == "" {
		if adm, ran, err := c.runLocal(ctx, req, key, jobID); ran {
			return adm, err
		}
		return c.create(ctx, req, key, jobID, Bypassed)
	}
	// Listed before it is claimed: a retry sent while this claim waits (an election outlasts
	// an SDK's timeout) finds it, and claims the same key and job itself; whichever claim
	// lands first executes, and the other joins it.
	now := c.now()
	if err := c.store.AddRecent(ctx, req.ContentKey, kv.RecentExec{Key: key, Job: jobID, At: now}, now.Add(-bypassRetryWindow)); err != nil {
		// Unlisted, its retry executes again: what a bypass did before.
		c.log.Warn().Err(err).Str(fieldJobID, jobID).Msg("listing a bypassed SDK request for its retries")
	}
	listed := *req
	listed.Key = key
	return c.claimOrJoin(ctx, &listed, jobID, Bypassed)
}

// joinRetriedBypass attaches the retry req of a bypassed request to the one execution of its
// content listed within the window, or claims it (its key and job) when the listed attempt's
// claim has not landed yet. ok is false when none is listed, or more than one: the retry then
// executes.
func (c *Core) joinRetriedBypass(ctx context.Context, req *Request) (adm *Admission, ok bool, err error) {
	list, err := c.store.Recent(ctx, req.ContentKey, c.now().Add(-bypassRetryWindow))
	if err != nil {
		c.log.Warn().Err(err).Msg("reading a bypassed request's recent executions; the retry executes")
		return nil, false, nil
	}
	if len(list) != 1 {
		return nil, false, nil
	}
	e := list[0]
	joined := *req
	joined.Key, joined.Bypass = e.Key, false
	adm, err = c.claimOrJoin(ctx, &joined, e.Job, Bypassed)
	if err == nil {
		c.log.Info().Str(fieldJobID, e.Job).Str("outcome", string(adm.Outcome)).Msg("an SDK retry of a bypassed request found its attempt")
	}
	return adm, true, err
}

// claimOrJoin claims req.Key for job jobID (outcome names a new execution), or attaches to the
// record that holds it: the other of a bypassed request and its retry got there first.
func (c *Core) claimOrJoin(ctx context.Context, req *Request, jobID string, outcome Outcome) (*Admission, error) {
	for range maxDecisions {
		adm, err := c.create(ctx, req, req.Key, jobID, outcome)
		if !errors.Is(err, kv.ErrExists) {
			return adm, err
		}
		var held *kv.ExistsError
		errors.As(err, &held)
		if held != nil && (held.Record.Tenant != req.Tenant || held.Record.JobID != jobID) {
			return nil, ErrKeyForeign // a listed key is made from the job id: never another's
		}
		attached := *req
		attached.Bypass = false
		adm, err = c.attach(ctx, &attached, held, false)
		if errors.Is(err, errGone) || errors.Is(err, kv.ErrConflict) {
			continue
		}
		return adm, err
	}
	return nil, ErrContended
}
