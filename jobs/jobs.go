// Package jobs owns the unit of work and its JetStream plumbing: the Job wire type, the JOBS
// work-queue stream a job is published to (deduplicated by Nats-Msg-Id), the CHUNKS stream that
// carries an execution's output on its own subject, and the Hub that fans one execution's chunks
// out to every local HTTP client, replaying history to late joiners.
//
// Both streams use memory storage: the idempotency record in kv is the durable truth and can
// re-drive a lost job, so neither stream pays for fsync. A Hub is safe for concurrent use.
package jobs

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/oncegate/oncegate/internal/jspub"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/replicas"
)

// Stream and subject names.
const (
	JobsStream = "JOBS"
	// JobsSubjects is the JOBS subject space; a job of record key k is on jobs.run.<k>.
	JobsSubjects = "jobs.run.>"
	jobsPrefix   = "jobs.run."
	// heldPrefix starts the subject of a held job's message (HeldMsg), outside the subjects
	// the workers' consumer takes. JOBS still takes it: a node of an older version stores its
	// held jobs there during a rolling upgrade.
	heldPrefix   = "jobs.held."
	ChunksStream = "CHUNKS"
	chunksPrefix = "chunks."
	// noticePrefix starts the notice subjects (NoticeSubject), which no stream captures.
	noticePrefix = "og.end."
	// WireVersion is the version of the job wire format (Og-Job-V): the body is the record.
	WireVersion = 2
	// wireRequestBody is the version whose body is the request alone and whose record is the
	// Og-Record header (Job.Request). Nothing sends it any more; a worker still runs one that a
	// node older than wireRequestStored queued.
	wireRequestBody = 3
	// wireRequestStored is version 2 whose record stores its request in REQUESTS
	// (Job.RequestStored): the worker reads it from there. Its own number makes a worker that
	// predates it refuse the job rather than run the record's empty request.
	wireRequestStored = 4
)

// Job message headers; the message body is the idempotency record as claimed (or, version 3,
// the request, with the record in Og-Record).
const (
	hdrJobVersion = "Og-Job-V"
	hdrJobID      = "Og-Job-Id"
	hdrJobKey     = "Og-Key"
	hdrJobEpoch   = "Og-Epoch"
	hdrJobRev     = "Og-Rev"
	hdrJobRecord  = "Og-Record"
	hdrJobNotice  = "Og-Notice"
)

// ErrInvalidJob is returned when a job message cannot be decoded.
var ErrInvalidJob = errors.New("jobs: invalid job message")

// Job is one execution request: what a worker needs to run it, and the fencing facts (key and
// epoch) it must check against the idempotency record before it writes anything.
//
// On the wire (JOBS) a job is its identity in headers (id, key, epoch, and the revision of the
// record at submission) and, as the body, the idempotency record exactly as it was written
// (Record, opaque here): a worker that gets a fresh job need not read the record again, and the
// job can never say something the record does not. The other fields are the worker's view,
// filled from that record.
type Job struct {
	ID    string
	Key   string // record key (a hash, never client text)
	Epoch int
	// Rev is the record's revision when the job was submitted; Record its stored bytes.
	Rev    uint64
	Record []byte
	// RequestStored says that the record stores its request out of itself, in REQUESTS
	// (kv.RequestsStream): the message carries the record only, and the worker reads the
	// request from there. A large request then lives once in NATS, not in JOBS as well.
	RequestStored bool
	// Request is the request a version-3 job (an older node's) carried beside its record.
	Request []byte
	// Notice says that the follower which submitted a non-stream job listens for its outcome
	// on the notice subject (Hub.OpenNonStream with HubOptions.Notices): its worker announces
	// the outcome there, and stores no chunk (Publisher.SetNotice). A worker that predates it
	// stores the terminal chunk, and the follower answers from the record after its idle check.
	Notice bool

	Tenant string
	Model  string
	Stream bool
	// API is the request's wire format ("openai", "anthropic", "embeddings", "passthrough").
	API string
	// Path is a passthrough request's path below the backend's base URL.
	Path string
	// Backends is the route's fallback chain, in order.
	Backends []string
	// Degraded is the route's answer when no backend is healthy (nil: 503).
	DegradedMessage    string
	DegradedRetryAfter int
	// Body is the request as the backend receives it; Header holds passed-through headers.
	Body   json.RawMessage
	Header map[string][]string
	// Deadline is the client's overall deadline, if it sent one.
	Deadline time.Time
}

// Subject is the CHUNKS subject of this job's execution.
func (j *Job) Subject() string { return ChunkSubject(j.Key, j.ID, j.Epoch) }

// ChunkSubject names the CHUNKS subject of execution epoch of job jobID of a record key. The job
// id makes it unique: a key reused after its record expired starts again at epoch 1, and its
// new execution must not find (nor be refused by, nor replay to a joiner) the last one's
// chunks, which CHUNKS keeps for its retention.
//
// The subject is in the CHUNKS copy of key's partition (partition.OfKey): "p<k>.chunks." in
// partition k ≥ 1.
func ChunkSubject(key, jobID string, epoch int) string {
	return partition.OfKey(key).Subject(chunksPrefix) + key + "." + jobID + "." + strconv.Itoa(epoch)
}

// NoticeSubject is the subject of the notices of the execution whose chunks are on subject (a
// ChunkSubject): its outcome, a fence or a cancellation, each a terminal chunk sent as a plain
// message to whoever subscribes at that moment and never stored. No stream captures it.
func NoticeSubject(subject string) string {
	return noticePrefix + strings.TrimPrefix(subject, chunksPrefix)
}

// NewID returns a job id: a ULID with crypto-random entropy (job ids grant access).
func NewID() string {
	return ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
}

// ParseID reports whether s is a well-formed job id.
func ParseID(s string) bool {
	_, err := ulid.ParseStrict(s)
	return err == nil
}

// StreamConfig sizes the streams.
type StreamConfig struct {
	// ChunkRetention is how long chunks stay replayable from CHUNKS (records keep results longer).
	ChunkRetention time.Duration
	// MaxChunkBytes caps the CHUNKS stream's memory (0: DefaultMaxChunkBytes).
	MaxChunkBytes int64
	// Replicas of both streams (0 or 1: one). Memory streams with replicas lose nothing to one
	// server's loss: without them, every new job (JOBS) or every live execution's output
	// (CHUNKS) would stop while the one server holding the stream is down.
	Replicas int
	// Partition is whose copies of the streams to make (JOBS_P<k>, CHUNKS_P<k> in partition
	// k ≥ 1); Placement, when set, places them (a partition's own servers).
	Partition partition.P
	Placement *jetstream.Placement
}

// DefaultMaxChunkBytes is CHUNKS's memory cap: what JetStream reserves for it on each server
// holding a replica. A partitioned store divides it among its partitions' copies (they may
// share servers), so the reservation stays within the embedded server's memory.
const DefaultMaxChunkBytes = 512 << 20

// JobsStreamOf and ChunksStreamOf name partition p's JOBS and CHUNKS.
func JobsStreamOf(p partition.P) string   { return p.Stream(JobsStream) }
func ChunksStreamOf(p partition.P) string { return p.Stream(ChunksStream) }

// JobsSubjectsOf is partition p's JOBS subject space.
func JobsSubjectsOf(p partition.P) string { return p.Subject(JobsSubjects) }

// EnsureStreams creates or updates JOBS and CHUNKS; it is idempotent, and keeps a stream's
// replica count when it is larger than cfg's (a start never lowers what an operator raised).
// It is also how a gateway recreates them after a NATS restart lost them (memory storage).
func EnsureStreams(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	if cfg.ChunkRetention == 0 {
		cfg.ChunkRetention = 15 * time.Minute
	}
	if cfg.MaxChunkBytes == 0 {
		cfg.MaxChunkBytes = DefaultMaxChunkBytes
	}
	streams := []jetstream.StreamConfig{{
		Name:       JobsStreamOf(cfg.Partition),
		Subjects:   []string{JobsSubjectsOf(cfg.Partition), cfg.Partition.Subject(heldPrefix) + ">"},
		Placement:  cfg.Placement,
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.MemoryStorage,
		Duplicates: 2 * time.Minute,
		Replicas:   cfg.Replicas,
		// A held job an older version stored here (HeldMsg) expires by itself: no consumer
		// takes it. Once on, it stays on.
		AllowMsgTTL: true,
	}, {
		Name:              ChunksStreamOf(cfg.Partition),
		Subjects:          []string{cfg.Partition.Subject(chunksPrefix) + ">"},
		Placement:         cfg.Placement,
		Storage:           jetstream.MemoryStorage,
		MaxAge:            cfg.ChunkRetention,
		MaxBytes:          cfg.MaxChunkBytes,
		Discard:           jetstream.DiscardOld,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
		MaxMsgsPerSubject: 100_000,
		Replicas:          cfg.Replicas,
		// A terminal chunk that is its subject's only chunk expires by itself
		// (Publisher.SetFinalTTL) instead of costing a purge request. Once on, it stays on.
		AllowMsgTTL: true,
	}}
	for _, sc := range streams {
		if _, err := replicas.Ensure(ctx, js, sc); err != nil {
			return fmt.Errorf("jobs: ensure stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// Submit publishes a job to JOBS. The message id is key+epoch, so a re-published job inside
// the duplicate window is dropped by JetStream (the record is the real gate). Transient NATS
// failures are retried with that same id (a try applied although its answer was lost is
// dropped as a duplicate) for jsretry.Window or until ctx ends; then ErrUnavailable.
func Submit(ctx context.Context, js jetstream.JetStream, job *Job) error {
	m, err := message(job, jobsPrefix, "")
	if err != nil {
		return err
	}
	return publish(ctx, js, job, m)
}

// HeldMsg is job's message as a worker of this node takes it when it runs the job itself (a
// held job, intent.Holder), without JetStream storing or delivering it. Nothing else needs it:
// the job is its record (Job.Record), which the claim stored with everything that re-drives the
// job, under a Nats-Msg-Id of its own (kv.ClaimMsgID); a takeover reads the record. So a held
// job costs no JOBS write, consumer delivery, ack or work-queue removal: four of a cluster
// intent's eight replicated writes (issue 44). Its worker's death is found by the other nodes'
// pools: the record names the worker (kv.Record.Worker), which stops answering for itself
// (PoolGone). Until this version a held job was also stored in JOBS for a second, on a subject
// of heldPrefix; nothing read it back.
func HeldMsg(job *Job) (*nats.Msg, error) {
	return message(job, heldPrefix, "held.")
}

// message is job's message on its key's subject under prefix (a partition's), its message id
// starting with idPrefix.
func message(job *Job, prefix, idPrefix string) (*nats.Msg, error) {
	if len(job.Record) == 0 || job.Rev == 0 {
		return nil, fmt.Errorf("%w: job %s has no record", ErrInvalidJob, job.ID)
	}
	m := nats.NewMsg(partition.OfKey(job.Key).Subject(prefix) + job.Key)
	m.Header.Set(hdrJobVersion, strconv.Itoa(WireVersion))
	m.Header.Set(hdrJobID, job.ID)
	m.Header.Set(hdrJobKey, job.Key)
	m.Header.Set(hdrJobEpoch, strconv.Itoa(job.Epoch))
	m.Header.Set(hdrJobRev, strconv.FormatUint(job.Rev, 10))
	m.Data = job.Record
	if job.RequestStored {
		m.Header.Set(hdrJobVersion, strconv.Itoa(wireRequestStored))
	}
	if job.Notice {
		m.Header.Set(hdrJobNotice, "1")
	}
	// The job id is in the message id: a key reused after its record expired starts again at
	// epoch 1, and JetStream would drop that claim's job as a copy of the last one's.
	m.Header.Set(jetstream.MsgIDHeader, idPrefix+job.Key+"."+strconv.Itoa(job.Epoch)+"."+job.ID)
	return m, nil
}

// publish stores m, job's message, in JOBS, retried as Submit says.
func publish(ctx context.Context, js jetstream.JetStream, job *Job, m *nats.Msg) error {
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		_, err := jspub.Publish(ctx, js.Conn(), m)
		return err
	})
	if err != nil {
		return fmt.Errorf("jobs: submit %s: %w", job.ID, err)
	}
	return nil
}

// Decode parses a job message into its identity, record bytes and where its request is; the
// caller decodes the record and fills the rest of the view.
func Decode(h nats.Header, data []byte) (*Job, error) {
	v, _ := strconv.Atoi(h.Get(hdrJobVersion))
	epoch, _ := strconv.Atoi(h.Get(hdrJobEpoch))
	rev, _ := strconv.ParseUint(h.Get(hdrJobRev), 10, 64)
	j := &Job{ID: h.Get(hdrJobID), Key: h.Get(hdrJobKey), Epoch: epoch, Rev: rev, Record: data, Notice: h.Get(hdrJobNotice) == "1"}
	switch v {
	case wireRequestBody:
		j.Record, j.Request = []byte(h.Get(hdrJobRecord)), data
	case wireRequestStored:
		j.RequestStored = true
	}
	if (v != WireVersion && v != wireRequestBody && v != wireRequestStored) || j.Key == "" || j.Epoch < 1 || j.ID == "" || j.Rev == 0 || len(j.Record) == 0 {
		return nil, fmt.Errorf("%w: version %d key %q epoch %d rev %d, %d record bytes", ErrInvalidJob, v, j.Key, j.Epoch, j.Rev, len(j.Record))
	}
	return j, nil
}

// Queued reports whether JOBS still holds a job of record key (waiting, or delivered and not
// yet acked): such a job will run or be redelivered, so it must not be re-driven.
func Queued(ctx context.Context, js jetstream.JetStream, key string) (bool, error) {
	p := partition.OfKey(key)
	st, err := js.Stream(ctx, JobsStreamOf(p))
	if err != nil {
		return false, fmt.Errorf("jobs: %w", err)
	}
	_, err = st.GetLastMsgForSubject(ctx, p.Subject(jobsPrefix)+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("jobs: queued %s: %w", key, err)
	}
	return true, nil
}
