// The state machine of one idempotency key (DESIGN.md, "States of a key"): the record, and
// its transitions as pure methods. Each returns a new *Record and leaves its receiver as it
// was, so every write site reads store.Update(ctx, key, rec.X(...), rev), and a lost
// compare-and-set leaves the caller holding a valid record.
//
//	state      a new request with this key…
//	(none)     never seen, or expired: claims it (atomic create), becomes the owner, a job is
//	           published
//	PENDING    an execution is queued or running; the record names the job and its lease:
//	           joins (a stream replays the chunks sent, then follows live; a non-stream request
//	           waits for the result up to max_wait, then 409 with Retry-After)
//	COMPLETED  finished, the result kept for the TTL: gets the stored result (same status and
//	           body; a stream gets the chunks replayed)
//	FAILED     failed with a retryable cause, or released: may claim it again (a new epoch);
//	           any other failure (an attempt that may have run at the backend, a stream broken
//	           after output, a cancel) is replayed instead. A backend's 4xx, which would fail
//	           the same way again, is stored COMPLETED
//
//	from       transition    to         called by (when)
//	(none)     claim         PENDING    intent admission: a new record, epoch 1 (Store.Claim)
//	FAILED     reclaim       PENDING    intent admission: a new record, epoch+1, when Retryable
//	                                    and not Cancelled (also any finished record of an auto
//	                                    key past its window: a new job)
//	PENDING    Dispatched    PENDING    workers: the first attempt was sent (kept in memory;
//	                                    the next renewal or the outcome writes it)
//	PENDING    Renewed       PENDING    workers' renewal, every RenewEvery: lease extended, the
//	                                    chunks and tokens streamed so far
//	PENDING    TakenOver     PENDING    intent.TakeOver (a redelivered job, the lease sweep, an
//	                                    API node): the lease ran out; epoch+1, and the old
//	                                    epoch's sent attempts kept as Unfinished
//	PENDING    Completed     COMPLETED  workers: an answer, or a backend error that would fail
//	                                    the same way again
//	PENDING    Failed        FAILED     workers: no answer (Retryable when no attempt may have
//	                                    run), or a stream that broke after output (Partial)
//	PENDING    CancelledAt   FAILED     intent (DELETE /v1/jobs/{id}): 409, Cancelled, the
//	                                    epoch's sent attempts kept as Unfinished
//	PENDING    Released      FAILED     intent: the claim's job could not be published;
//	                                    retryable 503. Also the lease sweep, for a claim or
//	                                    reclaim the store took after its AdmitBy (its request
//	                                    was refused with 503 by then): never executed
//	any        TTL           (none)     the bucket, TTL after the last write
//
// Every write is conditional on the revision read (Store.Update): the revision is the fence,
// so of two writers from one state only the first moves the record; the other gets
// ErrConflict and stops.

package kv

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"time"
)

// State of a key.
type State string

// States.
const (
	Pending   State = "PENDING"
	Completed State = "COMPLETED"
	Failed    State = "FAILED"
)

// Progress of the execution of a PENDING record.
const (
	ProgressQueued     = "queued"
	ProgressDispatched = "dispatched"
	ProgressStreaming  = "streaming"
	ProgressFinished   = "finished"
)

// Record is the state of one idempotency key.
type Record struct {
	V           int    `json:"v"`
	State       State  `json:"state"`
	Tenant      string `json:"tenant"`
	JobID       string `json:"job_id"`
	Epoch       int    `json:"epoch"`
	Fingerprint string `json:"fp"`
	// Owner is a nonce of the claimant: a retried Create that answers "exists" compares it.
	Owner    string `json:"owner"`
	Auto     bool   `json:"auto,omitempty"`
	Bypassed bool   `json:"bypassed,omitempty"`

	Created      time.Time `json:"created"`
	EpochStarted time.Time `json:"epoch_started"`
	LeaseUntil   time.Time `json:"lease_until,omitempty"`
	Worker       string    `json:"worker,omitempty"`
	Progress     string    `json:"progress,omitempty"`
	Chunks       int       `json:"chunks,omitempty"` // chunks published so far in this epoch
	Tokens       int       `json:"tokens,omitempty"` // output events (≈ tokens) so far in this epoch
	Attempts     int       `json:"attempts,omitempty"`
	// Takeovers counts epochs whose owner vanished (their attempts may have reached the backend).
	Takeovers int  `json:"takeovers,omitempty"`
	Cancelled bool `json:"cancelled,omitempty"`
	// Unfinished are the epochs whose attempts were sent to a backend and ended with no
	// outcome stored: taken over after their worker vanished, or cancelled. The backend may
	// have billed them; they are charged (estimated) with the record's outcome.
	Unfinished []Unfinished `json:"unfinished,omitempty"`
	// RequestBytes is the size of the request, kept when the request is dropped from a
	// finished record (or stored in REQUESTS), for the input estimate of a charge without
	// usage.
	RequestBytes int `json:"request_bytes,omitempty"`
	// RequestAt is the epoch of the claim that stored the request in REQUESTS (see
	// RequestsStream) because it was too large to ride in the record; 0: the record carries
	// it. Such a record's Request is empty as read from the bucket and holds the bytes as
	// decoded from its job message (or set by WithRequest).
	RequestAt int `json:"request_at,omitempty"`
	// RequestPiece is the size of the pieces REQUESTS holds that request in; 0: one message
	// (a record stored before pieces).
	RequestPiece int `json:"request_piece,omitempty"`

	Model string `json:"model"`
	// API is the wire format of the request: "openai", "anthropic", "embeddings" or
	// "passthrough".
	API string `json:"api,omitempty"`
	// Path is a passthrough request's path below the backend's base URL.
	Path string `json:"path,omitempty"`
	// Backends is the route's fallback chain; Backend is the one that answered.
	Backends []string  `json:"backends,omitempty"`
	Backend  string    `json:"backend"`
	Degraded *Degraded `json:"degraded,omitempty"`
	Stream   bool      `json:"stream"` // the execution's mode (the first request's)
	// Request is the body the backend gets, with the headers passed through; kept while
	// PENDING so the job can be re-driven. It is stored after the record's JSON, not in it
	// (see Encode), or in REQUESTS (RequestAt).
	Request json.RawMessage     `json:"-"`
	Header  map[string][]string `json:"header,omitempty"`
	// Deadline is the client's overall deadline, if it sent one (Oncegate-Timeout).
	Deadline time.Time `json:"deadline,omitempty"`
	// TraceID is the W3C trace id of the request that created the record (its execution's
	// spans and backend calls continue that trace); kept once the record is finished.
	TraceID string `json:"trace_id,omitempty"`
	// Echo is what an API that renders the backend's answer in a format of its own needs
	// beyond that answer (the Responses API: the request fields its response object repeats,
	// and the conversation a later request continues); opaque here, kept for the TTL.
	Echo json.RawMessage `json:"echo,omitempty"`
	// ChargeKey is the key the execution ran and is charged under, when this record is a
	// copy kept under another key (Archived); empty: the record's own key.
	ChargeKey string `json:"charge_key,omitempty"`
	// Arrived is when the request that created the record reached the gateway (before any
	// wait for the store); zero in records written before it was kept (FirstArrived).
	Arrived time.Time `json:"arrived,omitzero"`
	// AdmitBy is set by an admission's write (a claim or a reclaim) and by nothing else: the
	// instant its API stops waiting for that write and refuses the request (503). A write that
	// the store stored after it was refused, so it must never start an execution (see
	// Store.AdmittedLate). Every other transition clears it (clone).
	AdmitBy time.Time `json:"admit_by,omitzero"`

	Result *Result `json:"result,omitempty"`
}

// Degraded is the answer a route gives when none of its backends is healthy.
type Degraded struct {
	Message    string `json:"message,omitempty"`
	RetryAfter int    `json:"retry_after,omitempty"` // seconds
}

// Result is the stored outcome of an execution.
type Result struct {
	Status int `json:"status"`
	// Body is the response JSON of a non-stream execution, or the error body of a failure.
	// Kept as bytes (base64 in the record), never as json.RawMessage: a replay must be byte
	// for byte what the backend sent, and encoding/json compacts raw messages.
	Body []byte `json:"body,omitempty"`
	// ContentType is the Content-Type of a passthrough answer's Body (the other APIs answer
	// JSON).
	ContentType string `json:"content_type,omitempty"`
	// Events are the SSE frames of a streamed execution (without the usage frame and [DONE]).
	Events []byte `json:"events,omitempty"`
	// UsageEvent is the usage-only SSE frame of a streamed execution, if the backend sent one.
	UsageEvent []byte `json:"usage_event,omitempty"`
	Usage      *Usage `json:"usage,omitempty"`
	// Retryable marks a failure before any output: the key may be claimed again (new epoch).
	Retryable bool `json:"retryable,omitempty"`
	// Partial marks a failure after output: Events hold what was sent before the error.
	Partial bool `json:"partial,omitempty"`
	// Finished is when the outcome was stored (the record expires TTL after it).
	Finished time.Time `json:"finished"`
	// Backend answered after Attempts backend attempts (retries, fallbacks, continuations).
	Backend  string `json:"backend,omitempty"`
	Attempts int    `json:"attempts,omitempty"`
	// Degraded: no backend was healthy; the route's degraded answer was given.
	Degraded bool `json:"degraded,omitempty"`
	// Resumed counts stream continuations; ContinuationUsage is their usage, one per attempt.
	Resumed           int     `json:"resumed,omitempty"`
	ContinuationUsage []Usage `json:"continuation_usage,omitempty"`
	// Ambiguous counts attempts that were written and ended without an answer (the backend
	// may have run them): reported, never hidden.
	Ambiguous int `json:"ambiguous,omitempty"`
}

// Usage is the token usage the backend reported.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// FirstArrived is when the request that created r reached the gateway: Arrived, or Created
// for a record written before Arrived was kept.
func (r *Record) FirstArrived() time.Time {
	if r.Arrived.IsZero() {
		return r.Created
	}
	return r.Arrived
}

// requestSize is the request's size: its bytes', or as kept when they are not in r.
func (r *Record) requestSize() int {
	if len(r.Request) > 0 {
		return len(r.Request)
	}
	return r.RequestBytes
}

// StoreRequestOut marks a new claim's request (r.Request) as stored in REQUESTS under the
// claim's epoch rather than in the record (Store.StoresRequest says when).
func (r *Record) StoreRequestOut() {
	r.RequestAt, r.RequestPiece, r.RequestBytes = r.Epoch, requestPiece, len(r.Request)
}

// WithRequest is r carrying body, the request it stores in REQUESTS (as Store.Request read
// it, or as another decoding of the same claim carried it). r is not modified.
func (r *Record) WithRequest(body []byte) *Record {
	out := *r
	out.Request = body
	return &out
}

// Archived is r as a copy kept under another key than key, the one its execution ran under
// (an auto key's finished execution, kept reachable by its job id before the auto key moves
// on to a newer identical request). The copy is charged under key, with the same entry ids
// as the original: one execution, one charge, whichever record a sweep reads. r is not
// modified.
func (r *Record) Archived(key string) *Record {
	out := *r
	if out.ChargeKey == "" {
		out.ChargeKey = key
	}
	return &out
}

// ChargedUnder is the key hash r's execution is charged under, r being stored under key.
func (r *Record) ChargedUnder(key string) string {
	if r.ChargeKey != "" {
		return r.ChargeKey
	}
	return key
}

// LeaseExpired reports whether a PENDING record's lease ran out at now.
func (r *Record) LeaseExpired(now time.Time) bool {
	return r.State == Pending && !r.LeaseUntil.IsZero() && now.After(r.LeaseUntil)
}

// NewOwner returns a random owner nonce.
func NewOwner() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Unfinished is one epoch's backend attempts that ended with no stored outcome.
type Unfinished struct {
	Epoch int `json:"epoch"`
	// Attempts sent to a backend in that epoch (the charge is numbered by it).
	Attempts int    `json:"attempts"`
	Backend  string `json:"backend,omitempty"`
	// Tokens are the output events (≈ tokens) seen before it ended, as its progress said.
	Tokens int `json:"tokens,omitempty"`
	// RequestBytes sizes the input estimate.
	RequestBytes int `json:"request_bytes"`
	// Cancelled: ended by DELETE /v1/jobs/{id}; otherwise its worker vanished (taken over).
	Cancelled bool `json:"cancelled,omitempty"`
}

// addUnfinished records in r the attempts of progress p as unfinished (epoch p.Epoch ends
// without an outcome) and counts them in Attempts. A p of another job or
// with nothing sent adds nothing. It is how a takeover and a cancel keep an attempt the
// backend may have run and billed: counted and reported, never hidden.
func (r *Record) addUnfinished(p *Progress, cancelled bool) {
	if p == nil || p.JobID != r.JobID || p.Attempt == 0 {
		return
	}
	for _, u := range r.Unfinished {
		if u.Epoch == p.Epoch {
			return
		}
	}
	r.Unfinished = append(r.Unfinished, Unfinished{Epoch: p.Epoch, Attempts: p.Attempt, Backend: p.Backend,
		Tokens: p.Tokens, RequestBytes: r.requestSize(), Cancelled: cancelled})
	r.Attempts += p.Attempt
}

// WithProgress is rec as its execution's progress p shows it: a PENDING record of p's job and
// epoch whose attempt was sent reads as running, with the attempts, backend and tokens so far.
// Any other record (finished, or of another epoch than p) is returned unchanged. rec is not
// modified.
func (r *Record) WithProgress(p *Progress) *Record {
	if p == nil || r.State != Pending || p.JobID != r.JobID || p.Epoch != r.Epoch || p.Attempt == 0 {
		return r
	}
	out := *r
	out.Attempts = r.Attempts + p.Attempt
	out.Backend = p.Backend
	out.Tokens = max(r.Tokens, p.Tokens)
	if out.Progress == "" || out.Progress == ProgressQueued {
		out.Progress = ProgressDispatched
	}
	if out.Tokens > 0 {
		out.Progress = ProgressStreaming
	}
	return &out
}

// The transitions. Each starts from clone, so it never edits its receiver; the fields they
// share with it (Request, Header, Backends, Result's bytes) are replaced, never edited.

// clone is a copy of r a transition may edit: Unfinished, the one slice a transition appends
// to, is copied so the receiver's cannot be written through it.
func (r *Record) clone() *Record {
	out := *r
	out.Unfinished = slices.Clone(r.Unfinished)
	out.AdmitBy = time.Time{} // only an admission's own write carries it
	return &out
}

// Dispatched is r once its execution sent the first attempt to a backend (PENDING → PENDING).
func (r *Record) Dispatched() *Record {
	out := r.clone()
	out.Progress = ProgressDispatched
	return out
}

// Renewed is r with its lease extended to now+lease by worker (PENDING → PENDING). Once the
// epoch has published chunks (chunks > 0) it reads as streaming, with the chunks and tokens
// so far; before that its progress, chunks and tokens stay as they were.
func (r *Record) Renewed(now time.Time, lease time.Duration, worker string, chunks, tokens int) *Record {
	out := r.clone()
	out.LeaseUntil = now.Add(lease)
	out.Worker = worker
	if chunks > 0 {
		out.Progress, out.Chunks, out.Tokens = ProgressStreaming, chunks, tokens
	}
	return out
}

// TakenOver is r moved to its next epoch at now after its lease ran out (PENDING → PENDING):
// a new lease, queued again with no worker and no chunks. The vanished owner's attempts are
// counted, never hidden, and charged with the record's outcome (estimated): the backend may
// have run and billed them. p, that epoch's progress as read (nil if none; one of another job
// or epoch is ignored), says what it sent; without it (a restart of the memory stream), a
// record a renewal marked dispatched or streaming certainly reached the backend, and any
// other may or may not have (Takeovers counts it).
func (r *Record) TakenOver(now time.Time, lease time.Duration, p *Progress) *Record {
	old := r.Epoch
	if p != nil && (p.JobID != r.JobID || p.Epoch != old) {
		p = nil
	}
	if p == nil && (r.Progress == ProgressDispatched || r.Progress == ProgressStreaming) {
		p = &Progress{JobID: r.JobID, Epoch: old, Attempt: 1, Backend: r.Backend, Tokens: r.Tokens}
	}
	out := r.clone()
	out.Epoch = old + 1
	out.EpochStarted = now
	out.LeaseUntil = now.Add(lease)
	out.Takeovers++
	out.addUnfinished(p, false)
	out.Worker = ""
	out.Progress = ProgressQueued
	out.Chunks = 0
	return out
}

// Execution is what one epoch's execution did, as its worker stores it with the outcome.
type Execution struct {
	Worker    string // the worker that ran it
	Backend   string // the backend that answered ("" if none did)
	Attempts  int    // backend attempts made (retries, fallbacks, continuations)
	Ambiguous int    // attempts written that ended without an answer
	Degraded  bool   // the route's degraded answer was given
	Chunks    int    // chunks published in this epoch
	Tokens    int    // output events (≈ tokens) published in this epoch
}

// Completed is r with the outcome res of execution ex stored at now (PENDING → COMPLETED):
// an answer, or a backend error that would fail the same way again. See finished.
func (r *Record) Completed(now time.Time, res *Result, ex Execution) *Record {
	return r.finished(Completed, now, res, ex)
}

// Failed is r with the failure res of execution ex stored at now (PENDING → FAILED):
// res.Retryable releases the key, res.Partial keeps a broken stream's output. See finished.
func (r *Record) Failed(now time.Time, res *Result, ex Execution) *Record {
	return r.finished(Failed, now, res, ex)
}

// finished is r in state with a copy of res as its result, stamped with now and what ex did.
// The request is dropped (only its size is kept, for a charge's input estimate) and so is the
// lease: a finished record is nobody's to renew.
func (r *Record) finished(state State, now time.Time, res *Result, ex Execution) *Record {
	result := *res
	result.Finished = now
	result.Backend, result.Attempts, result.Degraded, result.Ambiguous = ex.Backend, ex.Attempts, ex.Degraded, ex.Ambiguous
	out := r.clone()
	out.State = state
	out.Result = &result
	out.RequestBytes = r.requestSize()
	out.Request = nil
	out.Progress = ProgressFinished
	out.Chunks, out.Tokens = ex.Chunks, ex.Tokens
	out.LeaseUntil = time.Time{}
	out.Worker = ex.Worker
	out.Attempts += ex.Attempts
	out.Backend = ex.Backend
	return out
}

// CancelledAt is r cancelled at now by DELETE /v1/jobs/{id} (PENDING → FAILED, Cancelled),
// its result the 409 error body. (Cancelled is the record's flag, so the transition cannot
// take that name.) An attempt already sent keeps running at the backend until the worker sees
// the cancel: p, the epoch's progress (nil if none; one of another epoch is ignored), adds it
// to Unfinished, counted and charged (estimated) from the record, never hidden.
func (r *Record) CancelledAt(now time.Time, body []byte, p *Progress) *Record {
	out := r.clone()
	if p != nil && p.Epoch == r.Epoch {
		out.addUnfinished(p, true)
		// What it did before the cancel, as the progress said it (the record has it only
		// from a lease renewal): a cancelled stream does not read as never started.
		if p.JobID == r.JobID && p.Attempt > 0 {
			out.Tokens, out.Backend = max(out.Tokens, p.Tokens), cmp.Or(out.Backend, p.Backend)
		}
	}
	out.RequestBytes = r.requestSize()
	out.Progress = ProgressFinished
	out.State, out.Cancelled, out.Request = Failed, true, nil
	out.Result = &Result{Status: http.StatusConflict, Body: body, Finished: now}
	return out
}

// Released is r given back (PENDING → FAILED, retryable 503): its claim's job could not be
// published, so the client's retry claims the key again and executes.
func (r *Record) Released() *Record {
	out := r.clone()
	out.State, out.Request = Failed, nil
	out.Result = &Result{Status: http.StatusServiceUnavailable, Retryable: true}
	return out
}
