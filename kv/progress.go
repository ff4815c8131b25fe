package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/replicas"
)

// ProgressStream holds how far the execution of each PENDING record has got, as its worker
// last said: the attempt sent, the backend, when, and the output tokens seen so far, and the
// record key (so a synchronous request's job id leads to its record: JobKey). One message per
// job and epoch on progress.<job id>.<epoch>: after a takeover, the worker that lost the
// record can still write its epoch's progress (until it notices), and that must not overwrite
// the new epoch's.
//
// It is a memory stream written asynchronously, never on a request's critical path, because
// progress is not state that must survive a crash: the record is the truth, and a PENDING
// record without progress reads as queued. Writing it into the record instead would add a
// synced write per request (the durability budget allows two: the claim and the outcome) and
// put a third writer on the record's revision chain, beside the lease renewals and the final
// write. Readers (the status API, a takeover) overlay it on a PENDING record of the same job
// and epoch (Record.WithProgress); a finished record ignores it.
//
// Its cap counts messages: a worker refreshes a running execution's entry every few seconds
// (ProgressRefresh), so only executions queued or finished longer ago than the cap covers
// drop out, and memory stays at ~350 B × progressMaxMsgs.
const ProgressStream = "PROGRESS"

const (
	progressPrefix  = "progress."
	progressMaxAge  = time.Hour
	progressMaxMsgs = 50_000
)

// ProgressRefresh is the longest a worker leaves a running execution's progress unwritten, so
// that progressMaxMsgs newer entries of other keys cannot push it out of the stream.
const ProgressRefresh = 2 * time.Second

// Progress is the worker's account of the current epoch's execution of a record.
type Progress struct {
	// Key is the record key of the job (PutProgress sets it).
	Key   string `json:"key"`
	JobID string `json:"job_id"`
	Epoch int    `json:"epoch"`
	// Attempt counts the backend attempts of this epoch sent so far (1 = the first send).
	Attempt int    `json:"attempt"`
	Backend string `json:"backend"`
	// Sent is when the latest attempt was sent.
	Sent time.Time `json:"sent"`
	// Tokens counts output events (≈ tokens) seen so far in this epoch.
	Tokens int `json:"tokens,omitempty"`
	// Worker is the pool that sent it (workers.Options.ID): a taker asks whether that pool is
	// still there (jobs.PoolGone) before the lease runs out.
	Worker string `json:"worker,omitempty"`
}

// openProgress opens PROGRESS on file storage, never synced: on one replica in async persist
// mode (a write costs no fsync, whatever nats.sync says), replicated as NATS flushes a
// replicated stream. A memory stream lost it with its server: after a single node's restart, a
// takeover found no account of the attempt its worker had sent, and neither counted nor
// charged it (issue 34); a file keeps what a killed process had handed to its server, all but
// the last few milliseconds. NATS cannot change a stream's storage or persist mode, so a
// PROGRESS made otherwise (memory, by an older version; async, before its replicas were
// raised) is deleted first: it holds only the progress of the executions running now.
func openProgress(ctx context.Context, js jetstream.JetStream, nm names, n int, placement *jetstream.Placement) (jetstream.Stream, error) {
	n, _, err := replicas.Of(ctx, js, nm.progress, n)
	if err != nil {
		return nil, fmt.Errorf("kv: open progress %s: %w", nm.progress, err)
	}
	cfg := lastValueStream(nm.progress, nm.progressPrefix, progressMaxAge, progressMaxMsgs, n)
	cfg.Storage, cfg.Placement = jetstream.FileStorage, placement
	if n == 1 {
		cfg.PersistMode = jetstream.AsyncPersistMode
	}
	if st, err := js.Stream(ctx, nm.progress); err == nil {
		if have := st.CachedInfo().Config; have.Storage != cfg.Storage || have.PersistMode != cfg.PersistMode {
			if err := js.DeleteStream(ctx, nm.progress); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, fmt.Errorf("kv: recreate %s on file storage: %w", nm.progress, err)
			}
		}
	}
	st, err := replicas.Ensure(ctx, js, cfg)
	if err != nil {
		return nil, fmt.Errorf("kv: open progress %s: %w", nm.progress, err)
	}
	return st, nil
}

// lastValueStream is a memory stream keeping the last message of each subject under prefix,
// for maxAge, and at most maxMsgs of them (the oldest go first), read by direct get.
func lastValueStream(name, prefix string, maxAge time.Duration, maxMsgs int64, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              name,
		Subjects:          []string{prefix + ">"},
		Storage:           jetstream.MemoryStorage,
		MaxAge:            maxAge,
		MaxMsgs:           maxMsgs,
		Discard:           jetstream.DiscardOld,
		MaxMsgsPerSubject: 1,
		Replicas:          replicas,
		AllowDirect:       true,
	}
}

// PutProgress publishes p as the progress of key's execution without waiting for the server
// (fireAndForget): a lost write only makes the status API a little behind.
func (s *Store) PutProgress(key string, p *Progress) error {
	p.Key = key
	data, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("kv: progress %s: %w", key, err)
	}
	if err := s.fireAndForget(s.progressSubject(p.JobID, p.Epoch), data); err != nil {
		return fmt.Errorf("kv: progress %s: %w", key, err)
	}
	return nil
}

// progressSubject is where the progress of job jobID's execution in epoch is kept.
func (s *Store) progressSubject(jobID string, epoch int) string {
	return s.names.progressPrefix + jobID + "." + strconv.Itoa(epoch)
}

// Progress reads the last progress of job jobID's execution in epoch; ErrNotFound if there is
// none.
func (s *Store) Progress(ctx context.Context, jobID string, epoch int) (*Progress, error) {
	m, err := s.prog.GetLastMsgForSubject(ctx, s.progressSubject(jobID, epoch))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("kv: progress of %s: %w", jobID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("kv: progress of %s: %w", jobID, err)
	}
	return decodeProgress(jobID, m.Data)
}

// lastProgressOf reads the last progress of job jobID, of any epoch; ErrNotFound if there is
// none. A wildcard subject cannot go in a direct get's subject, so it is a message get with a
// body, answered by the stream's leader: for a job id lookup, never on a request's path.
func (s *Store) lastProgressOf(ctx context.Context, jobID string) (*Progress, error) {
	m, err := leaderLastMsg(ctx, s.js, s.names.progress, s.names.progressPrefix+jobID+".*")
	if errors.Is(err, errGone) {
		return nil, fmt.Errorf("kv: progress of %s: %w", jobID, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("kv: progress of %s: %w", jobID, err)
	}
	return decodeProgress(jobID, m.Data)
}

func decodeProgress(jobID string, data []byte) (*Progress, error) {
	var p Progress
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("kv: progress of %s: %w", jobID, err)
	}
	return &p, nil
}
