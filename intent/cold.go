package intent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncegate/oncegate/cold"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/kv"
)

// ColdTier is the idempotency store's cold tier (cold.Tier): the records that left the hot
// IDEM bucket, indexed on this node.
type ColdTier interface {
	// Ready is nil when a key found in neither tier is new (cold.ErrBehind otherwise).
	Ready(now time.Time) error
	// Lookup finds key's newest copy in the local index, without any NATS request.
	Lookup(key string, now time.Time) (cold.Hit, bool, error)
	// Read fetches the copy's stored record.
	Read(ctx context.Context, key string, h cold.Hit) ([]byte, error)
}

// admitCold is admission's look at tier, the cold tier of the key's partition, before any
// claim (issue 46): the hot bucket keeps a key for the hot TTL only, so a claim that succeeds
// there may be a key whose record left it. done is false when the claim decides as before: the key is in neither tier (and the
// local index has applied everything that could have left the hot tier: else ErrBehind, a
// 503 store_unavailable, never "new"), its record is still hot, or its cold record asks for a
// new execution (an auto key past its window, a retryable failure, an abandoned PENDING),
// which the claim's create makes at most once whichever nodes race for it. A cold record to
// replay is replayed from the cold tier; the claim is never made for it. A node whose index
// is behind serves the keys the hot tier holds, and refuses the others.
//
// A key found in neither tier costs no JetStream request here (the index is local).
func (c *Core) admitCold(ctx context.Context, req *Request, tier ColdTier) (adm *Admission, done bool, err error) {
	now := c.now()
	behind := tier.Ready(now)
	hit, ok, err := tier.Lookup(req.Key, now)
	if err != nil {
		return nil, true, fmt.Errorf("intent: cold tier: %w: %w", kv.ErrUnavailable, err)
	}
	if !ok && behind == nil {
		return nil, false, nil
	}
	// A cold copy, or an index that cannot tell: the hot record, when there is one, is newer
	// than any cold copy, and decides.
	rec, rev, err := c.storeOf(req.Key).Get(ctx, req.Key)
	switch {
	case err == nil:
		adm, err := c.attach(ctx, req, &kv.ExistsError{Record: rec, Rev: rev}, false)
		if errors.Is(err, errGone) || errors.Is(err, kv.ErrConflict) {
			return nil, false, nil
		}
		return adm, true, err
	case !errors.Is(err, kv.ErrNotFound):
		return nil, true, fmt.Errorf("intent: read record: %w", err)
	case behind != nil:
		return nil, true, behind // not hot, and the cold index may lack it: never "new"
	}
	rec, err = c.readCold(ctx, tier, req.Key, hit)
	switch {
	case errors.Is(err, cold.ErrNotFound):
		return nil, false, nil // past its TTL: new
	case err != nil:
		return nil, true, err
	case rec.Tenant != req.Tenant:
		return nil, true, ErrKeyForeign
	case rec.Fingerprint != req.Fingerprint:
		return nil, true, ErrKeyReused
	}
	rule := c.match(req, rec, req.arrival(now))
	if rule == "" || rec.State == kv.Pending || (rec.State == kv.Failed && rec.Result != nil && rec.Result.Retryable && !rec.Cancelled) {
		return nil, false, nil
	}
	c.log.Debug().Str(fieldKey, req.Key).Uint64("cold_seq", hit.Seq).Msg("replayed from the cold tier")
	return explain(c.admission(Replayed, req.Key, rec, nil, nil), rule, req.RetryHeader, rec), true, nil
}

// coldOf is the cold tier of key's partition (nil: none).
func (c *Core) coldOf(key string) ColdTier { return c.parts[partition.OfKey(key)].Cold }

// readCold reads and decodes key's cold copy h from tier.
func (c *Core) readCold(ctx context.Context, tier ColdTier, key string, h cold.Hit) (*kv.Record, error) {
	data, err := tier.Read(ctx, key, h)
	if err != nil {
		if errors.Is(err, cold.ErrNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("intent: cold tier: %w: %w", kv.ErrUnavailable, err)
	}
	rec, err := kv.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("intent: cold record of %s: %w", key, err)
	}
	return rec, nil
}

// read is the record of key for the status and job APIs: the hot bucket's, else the cold
// tier's (rev 0: a cold record cannot be written over).
func (c *Core) read(ctx context.Context, key string) (*kv.Record, uint64, error) {
	rec, rev, err := c.storeOf(key).Get(ctx, key)
	tier := c.coldOf(key)
	if tier == nil || !errors.Is(err, kv.ErrNotFound) {
		return rec, rev, err
	}
	hit, ok, cerr := tier.Lookup(key, c.now())
	if cerr != nil || !ok {
		return rec, rev, err
	}
	crec, cerr := c.readCold(ctx, tier, key, hit)
	if cerr != nil {
		return rec, rev, err
	}
	return crec, 0, nil
}

// jobKey is the record key of job id of partition p: kv.Store.JobKey, else the cold tier's
// copy of the job's index entry.
func (c *Core) jobKey(ctx context.Context, p partition.P, id string) (string, error) {
	key, err := c.parts[p].Store.JobKey(ctx, id)
	tier := c.parts[p].Cold
	if tier == nil || !errors.Is(err, kv.ErrNotFound) {
		return key, err
	}
	ik := kv.JobIndexKey(id)
	hit, ok, cerr := tier.Lookup(ik, c.now())
	if cerr != nil || !ok {
		return key, err
	}
	data, cerr := tier.Read(ctx, ik, hit)
	if cerr != nil {
		return key, err
	}
	return string(data), nil
}
