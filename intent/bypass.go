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
	}
	adm, err := c.create(ctx, req, key, jobID, Bypassed)
	if err != nil || req.ContentKey == "" {
		return adm, err
	}
	now := c.now()
	if err := c.store.AddRecent(ctx, req.ContentKey, kv.RecentExec{Key: key, Job: jobID, At: now}, now.Add(-bypassRetryWindow)); err != nil {
		// Unlisted, its retry executes again: what a bypass did before.
		c.log.Warn().Err(err).Str(fieldJobID, jobID).Msg("listing a bypassed SDK request for its retries")
	}
	return adm, nil
}

// joinRetriedBypass attaches the retry req of a bypassed request to the one execution of its
// content listed within the window. ok is false when there is none, or more than one, or it
// is gone: the retry then executes.
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
	rec, rev, err := c.store.Get(ctx, e.Key)
	if err != nil {
		return nil, false, nil // expired (or unreadable): the retry executes
	}
	if rec.Tenant != req.Tenant || rec.Fingerprint != req.Fingerprint || rec.JobID != e.Job {
		return nil, false, nil
	}
	joined := *req
	joined.Key, joined.Bypass = e.Key, false
	adm, err = c.attach(ctx, &joined, &kv.ExistsError{Record: rec, Rev: rev}, false)
	if errors.Is(err, errGone) || errors.Is(err, kv.ErrConflict) {
		return nil, false, nil
	}
	if err == nil {
		c.log.Info().Str(fieldJobID, rec.JobID).Str("outcome", string(adm.Outcome)).Msg("an SDK retry of a bypassed request joined its execution")
	}
	return adm, true, err
}
