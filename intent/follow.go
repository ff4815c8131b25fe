package intent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// Record reads the record of key as stored now.
func (c *Core) Record(ctx context.Context, key string) (*kv.Record, error) {
	rec, _, err := c.read(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("intent: read %s: %w", key, err)
	}
	return rec, nil
}

// Follow joins the live chunks of key's execution of job jobID at epoch (replayed from the
// start); stream says whether the execution streams.
func (c *Core) Follow(ctx context.Context, key, jobID string, epoch int, stream bool) (*jobs.Follower, error) {
	fl, err := c.joinExecution(ctx, key, jobID, epoch, stream)
	if err != nil {
		return nil, fmt.Errorf("intent: follow %s: %w", key, err)
	}
	return fl, nil
}

// joinExecution follows key's execution of job jobID at epoch from its first chunk. A
// non-stream execution's outcome may come as a notice (jobs.NoticeSubject: never stored), and
// one sent before the subscription is not seen: its record is read once after joining, and
// the feed ends from it (EndStored) when the record says this epoch ended. (An epoch taken
// over ends with its fence, which is stored: the history has it.)
func (c *Core) joinExecution(ctx context.Context, key, jobID string, epoch int, stream bool) (*jobs.Follower, error) {
	subject := jobs.ChunkSubject(key, jobID, epoch)
	if stream {
		return c.hubOf(key).Join(ctx, subject)
	}
	fl, err := c.hubOf(key).JoinNonStream(ctx, subject)
	if err != nil {
		return nil, err
	}
	if rec, _, err := c.storeOf(key).Get(ctx, key); err == nil && rec.State != kv.Pending && rec.Epoch == epoch && rec.JobID == jobID {
		fl.EndStored()
	}
	return fl, nil
}

// FollowStream is Follow for an event stream a client of tenant opened on a live job (its
// events, a stored response's): it takes one of the tenant's streams first (a *LimitError at
// the cap, limits.go); release gives it back once the stream has ended.
func (c *Core) FollowStream(ctx context.Context, tenant, key, jobID string, epoch int, stream bool) (fl *jobs.Follower, release func(), err error) {
	release, err = c.limitsOf(tenant).stream()
	if err != nil {
		return nil, nil, err
	}
	if fl, err = c.Follow(ctx, key, jobID, epoch, stream); err != nil {
		release()
		return nil, nil, err
	}
	return fl, release, nil
}

// FindJob finds the job id of tenant: its record key and record. A malformed, unknown,
// expired or foreign id is the same ErrNoJob, and an unknown id costs what a foreign one does:
// a foreign id reads and decodes its record before the tenant check refuses it, so an unknown
// one reads the record of decoyKey (there is none: one KV round trip that answers not found)
// and decodes decoyRecord (a finished record's size) in its place, so that the time of the
// 404 does not tell another tenant's job ids from ids that do not exist (issue 17: 62-94 µs
// apart before).
func (c *Core) FindJob(ctx context.Context, tenant, id string) (key string, rec *kv.Record, rev uint64, err error) {
	if !jobs.ParseID(id) {
		return "", nil, 0, ErrNoJob
	}
	p, ok := partition.OfID(len(c.parts), id)
	if !ok { // an id no partition of this store makes
		c.decoyLookup(ctx, tenant, id)
		return "", nil, 0, ErrNoJob
	}
	key, err = c.jobKey(ctx, p, id)
	if errors.Is(err, kv.ErrNotFound) {
		c.decoyLookup(ctx, tenant, id)
		return "", nil, 0, ErrNoJob
	}
	if err != nil {
		return "", nil, 0, fmt.Errorf("intent: job %s: %w", id, err)
	}
	rec, rev, err = c.read(ctx, key)
	if errors.Is(err, kv.ErrNotFound) {
		return "", nil, 0, ErrNoJob
	}
	if err != nil {
		return "", nil, 0, fmt.Errorf("intent: job %s: %w", id, err)
	}
	if rec.Tenant != tenant || rec.JobID != id {
		return "", nil, 0, ErrNoJob
	}
	return key, rec, rev, nil
}

// decoyKey is a record key no intent can have: every record key is the HashParts of a
// tenant id, which is never empty, or an auto key of one.
var decoyKey = HashParts("", "decoy", "job lookup")

// decoyRecord is the stored form of a finished record of typical size: what decoyLookup
// decodes in place of a foreign job's record.
var decoyRecord = func() []byte {
	t := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	body := []byte(`{"id":"chatcmpl-decoy","object":"chat.completion","created":1767225600,"model":"decoy",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("decoy ", 8) + `"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}`)
	data, err := kv.Encode(&kv.Record{State: kv.Completed, Tenant: "decoy", JobID: "01KBDECOY0000000000000000", Epoch: 1,
		Fingerprint: strings.Repeat("0", 64), Owner: strings.Repeat("0", 32), Created: t, EpochStarted: t,
		Attempts: 1, Model: "decoy", API: "openai", Backends: []string{"decoy"}, Backend: "decoy", TraceID: strings.Repeat("0", 32),
		Result: &kv.Result{Status: 200, Body: body}})
	if err != nil {
		panic(fmt.Sprintf("intent: decoy record: %v", err))
	}
	return data
}()

// decoyLookup does the work FindJob does for a foreign id, for an unknown one: a record read
// (of decoyKey, which answers not found) and a decode with the tenant and id checks. The
// outcome is ignored: the caller answers ErrNoJob.
func (c *Core) decoyLookup(ctx context.Context, tenant, id string) {
	_ = c.parts[0].Store.Peek(ctx, decoyKey) // one read, as a foreign id's; Get would also ask the leader on its miss
	if rec, err := kv.Decode(decoyRecord); err == nil {
		// Never a match: the decoy's job id is no ULID (O is not in its alphabet).
		_ = rec.Tenant != tenant || rec.JobID != id
	}
}

// Lookup is the record of tenant's Idempotency-Key key (a client key, or a generated
// "auto-…" one) and its record key; ErrNoRecord if there is none for this tenant.
func (c *Core) Lookup(ctx context.Context, tenant, key string) (string, *kv.Record, error) {
	recKey := LookupKey(len(c.parts), tenant, key)
	rec, _, err := c.read(ctx, recKey)
	if errors.Is(err, kv.ErrNotFound) || (err == nil && rec.Tenant != tenant) {
		return "", nil, ErrNoRecord
	}
	if err != nil {
		return "", nil, fmt.Errorf("intent: lookup: %w", err)
	}
	return recKey, rec, nil
}

// WithProgress is a PENDING record as its worker's progress shows it (running from the send
// of its attempt, with the attempts, backend and tokens so far; see kv.ProgressStream), and
// that progress; a finished record, or one whose execution has not sent anything, is returned
// as it is, with a nil progress.
func (c *Core) WithProgress(ctx context.Context, key string, rec *kv.Record) (*kv.Record, *kv.Progress) {
	if rec.State != kv.Pending {
		return rec, nil
	}
	p, err := c.storeOf(key).Progress(ctx, rec.JobID, rec.Epoch)
	if err != nil {
		if !errors.Is(err, kv.ErrNotFound) {
			c.log.Debug().Err(err).Str(fieldKey, key).Msg("reading progress")
		}
		return rec, nil
	}
	out := rec.WithProgress(p)
	if out == rec {
		return rec, nil
	}
	return out, p
}
