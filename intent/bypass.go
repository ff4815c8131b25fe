package intent

import (
	"context"
	"errors"
	"time"

	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// A bypassed request (X-Allow-Duplicate, or a route's dedup off) executes every time: that is
// what its client asked for. But an official SDK retries a request that timed out, and that
// retry executed again too (issue 34: 48-65 duplicate executions per 10,000 intents, in every
// run, from bypassed requests alone). The SDK says which attempt a request is
// (x-stainless-retry-count: 0, 1, 2): so a bypassed request whose client sent that count
// (Request.ContentKey set) is listed among its content's recent executions (kv.Store.DecideRecent), and a
// retry of it (count ≥ 1) joins the execution of its content started within
// bypassRetryWindow when there is exactly one. When there are two or more, the client sent
// the same content twice on purpose, and which one the retry continues cannot be told: it
// executes, as the header asks (a false merge would give two intents one answer).
//
// The listing is one compare-and-set on the content's list (decideBypass), so an attempt and
// its retry that both waited out an election (the SDK's timeout is shorter than one) decide
// on the list as the other left it: the one that lands first lists its execution, the other
// joins it, whichever of the two it is.
//
// A bypass without the retry count runs as before: on this node's workers if it can, with no
// record; a listed one needs a record to be joined, so it takes the job path, and its listing
// costs a read and a synced write.

// bypassRetryWindow is how long after its start a listed execution can be joined by a retry:
// the official SDKs' default timeout is 10 minutes, and they retry after it.
const bypassRetryWindow = 10 * time.Minute

// bypass admits a bypassed request.
func (c *Core) bypass(ctx context.Context, req *Request) (*Admission, error) {
	jobID := jobs.NewID()
	key := partition.Key(len(c.parts), HashParts(req.Tenant, "bypass", jobID)) // unique per execution, whatever the key
	jobID = c.jobIDIn(key, jobID)
	if req.ContentKey == "" {
		if adm, ran, err := c.runLocal(ctx, req, key, jobID); ran {
			return adm, err
		}
		return c.create(ctx, req, key, jobID, Bypassed)
	}
	own := kv.RecentExec{Key: key, Job: jobID, At: c.now()}
	target, err := c.decideBypass(ctx, req, own)
	if err != nil {
		// Not listed: it executes as a bypass did before (its retry executes again).
		c.log.Warn().Err(err).Str(fieldJobID, jobID).Msg("listing a bypassed SDK request for its retries")
		return c.create(ctx, req, key, jobID, Bypassed)
	}
	if target == nil {
		return c.create(ctx, req, key, jobID, Bypassed) // an ambiguous retry: it executes, unlisted
	}
	listed := *req
	listed.Key = target.Key
	adm, err := c.claimOrJoin(ctx, &listed, target.Job, Bypassed)
	if err == nil && target.Job != jobID {
		c.log.Info().Str(fieldJobID, target.Job).Str("outcome", string(adm.Outcome)).Bool("retry", req.Retry).
			Msg("a bypassed SDK request found its other attempt")
	}
	return adm, err
}

// decideBypass decides, on its content's list as it stands (kv.Store.DecideRecent), what the
// bypassed SDK request req (own: its own execution, if it gets one) attaches to:
//
//   - a first attempt (retry count 0) joins a retry listed before it that no attempt has
//     joined yet (its own listing waited out an election while its retry went ahead), else it
//     lists own and executes;
//   - a retry joins the one execution listed; with none listed (its attempt's listing has not
//     landed), it lists own as a retry and executes, and its attempt will join it; with two or
//     more it cannot tell which is its attempt's, and executes unlisted (nil).
func (c *Core) decideBypass(ctx context.Context, req *Request, own kv.RecentExec) (*kv.RecentExec, error) {
	var target *kv.RecentExec
	err := c.storeOf(req.ContentKey).DecideRecent(ctx, req.ContentKey, c.now().Add(-bypassRetryWindow), func(list []kv.RecentExec) []kv.RecentExec {
		target = nil
		for i := range list {
			if list[i].Job == own.Job { // an earlier try of this very write landed
				t := list[i]
				target = &t
				return nil
			}
		}
		if !req.Retry {
			for i := range list {
				if list[i].Retry && !list[i].Matched {
					list[i].Matched = true
					t := list[i]
					target = &t
					return list
				}
			}
			target = &own
			return append(list, own)
		}
		switch len(list) {
		case 0:
			r := own
			r.Retry = true
			target = &r
			return []kv.RecentExec{r}
		case 1:
			t := list[0]
			target = &t
			return nil
		}
		return nil // ambiguous: target stays nil
	})
	return target, err
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
