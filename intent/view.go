package intent

import (
	"context"
	"time"

	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// The client APIs answer from views of a record, never from the record itself: what an
// answer needs, in delivery terms, so the state table stays in kv and its reading here.

// State is where an intent's execution stands (the status API's "state").
type State string

// States of a View.
const (
	Running   State = "PENDING"
	Completed State = "COMPLETED"
	Failed    State = "FAILED"
)

// Job statuses as the jobs API names them (View.Status).
const (
	JobQueued    = "queued"
	JobRunning   = "running"
	JobCancelled = "cancelled"
	JobCompleted = "completed"
	JobFailed    = "failed"
)

// TokenUsage is the token usage the backend reported.
type TokenUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// View is one intent's execution as the client APIs show it.
type View struct {
	ID     string
	Tenant string
	State  State
	// API is the wire format of the request: "openai", "anthropic", "embeddings",
	// "passthrough" or "responses".
	API   string
	Model string
	// Stream: the execution streams (its answer is Events; else Body).
	Stream bool
	Epoch  int
	// Attempts counts every epoch's backend attempts, as the record does.
	Attempts  int
	Takeovers int
	Cancelled bool
	Auto      bool
	Bypassed  bool
	// Progress of a running execution (queued, dispatched, streaming, finished).
	Progress string
	// Tokens is the output events (≈ tokens) so far of a running execution.
	Tokens       int
	Backend      string
	TraceID      string
	Created      time.Time
	EpochStarted time.Time
	LeaseUntil   time.Time
	// Arrived is when the request that created it reached the gateway.
	Arrived time.Time
	// Sent is when the running attempt was sent (zero when its progress is not known).
	Sent time.Time
	// Echo is what an API that renders the answer in its own format keeps beside it.
	Echo []byte
	// Answer is the outcome; nil while it runs.
	Answer *Answer

	key string
	rec *kv.Record // what the view shows (read-only)
}

// Answer is a finished execution's outcome as a client is answered from it.
type Answer struct {
	// Failed: the execution failed (else it completed: Status is the backend's answer,
	// a refusal when not 200).
	Failed bool
	Status int
	// Body is a non-stream answer, or a failure's provider-format error body.
	Body        []byte
	ContentType string
	// Events are a streamed execution's SSE frames (without the usage frame and the end),
	// UsageEvent its usage frame.
	Events     []byte
	UsageEvent []byte
	Usage      *TokenUsage
	// Partial: a failure after output (Events hold what was sent before it).
	Partial bool
	// Backend answered; Degraded: with the route's degraded answer.
	Backend  string
	Degraded bool
	Finished time.Time
}

// Running reports whether the execution has not finished.
func (j *View) Running() bool { return j.State == Running }

// Status is the jobs API's status of j.
func (j *View) Status() string {
	switch {
	case j == nil:
		return JobQueued
	case j.Cancelled:
		return JobCancelled
	case j.State == Completed:
		return JobCompleted
	case j.State == Failed:
		return JobFailed
	case j.Progress == kv.ProgressQueued:
		return JobQueued
	}
	return JobRunning
}

// OK reports whether a is a completed execution's 200 answer.
func (a *Answer) OK() bool { return !a.Failed && a.Status == 200 }

// viewOf is rec, the record of key, as a View.
func viewOf(key string, rec *kv.Record) *View {
	j := &View{ID: rec.JobID, Tenant: rec.Tenant, State: State(rec.State), API: rec.API, Model: rec.Model, Stream: rec.Stream,
		Epoch: rec.Epoch, Attempts: rec.Attempts, Takeovers: rec.Takeovers, Cancelled: rec.Cancelled, Auto: rec.Auto,
		Bypassed: rec.Bypassed, Progress: rec.Progress, Tokens: rec.Tokens, Backend: rec.Backend, TraceID: rec.TraceID,
		Created: rec.Created, EpochStarted: rec.EpochStarted, LeaseUntil: rec.LeaseUntil, Arrived: rec.FirstArrived(),
		Echo: rec.Echo, key: key, rec: rec}
	if res := rec.Result; res != nil {
		j.Answer = &Answer{Failed: rec.State == kv.Failed, Status: res.Status, Body: res.Body, ContentType: res.ContentType,
			Events: res.Events, UsageEvent: res.UsageEvent, Partial: res.Partial, Backend: res.Backend,
			Degraded: res.Degraded, Finished: res.Finished}
		if u := res.Usage; u != nil {
			j.Answer.Usage = &TokenUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
		}
	}
	return j
}

// View is the record the admission was decided on (or, after its delivery, the one it moved
// to); nil when it has none.
func (a *Admission) View() *View {
	if a.Rec == nil {
		return nil
	}
	return viewOf(a.Key, a.Rec)
}

// Claimed is when the execution the admission follows was claimed (its record's Created;
// zero: no record). Every copy of the execution reads the same instant from the record, so
// its key's expiry is counted from it: the record itself is kept TTL after its last write,
// which is never earlier.
func (a *Admission) Claimed() time.Time {
	if a.Rec == nil {
		return time.Time{}
	}
	return a.Rec.Created
}

// Reread is the admission's record as stored now.
func (a *Admission) Reread(ctx context.Context) (*View, error) {
	rec, err := a.core.Record(ctx, a.Key)
	if err != nil {
		return nil, err
	}
	return viewOf(a.Key, rec), nil
}

// Reread is the record of the delivery's execution as stored now.
func (d *Delivery) Reread(ctx context.Context) (*View, error) {
	rec, err := d.core.Record(ctx, d.key)
	if err != nil {
		return nil, err
	}
	return viewOf(d.key, rec), nil
}

// Epoch is the epoch of the execution the admission follows (0 when it has no record).
func (a *Admission) Epoch() int {
	if a.Rec == nil {
		return 0
	}
	return a.Rec.Epoch
}

// ParseJobID reports whether id is a well-formed job id.
func ParseJobID(id string) bool { return jobs.ParseID(id) }

// JobView finds the job id of tenant (FindJob), as a view.
func (c *Core) JobView(ctx context.Context, tenant, id string) (*View, error) {
	key, rec, _, err := c.FindJob(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return viewOf(key, rec), nil
}

// KeyStatus is the job of tenant's Idempotency-Key key (Lookup), as its worker's progress
// shows it (WithProgress).
func (c *Core) KeyStatus(ctx context.Context, tenant, key string) (*View, error) {
	recKey, rec, err := c.Lookup(ctx, tenant, key)
	if err != nil {
		return nil, err
	}
	return c.progressed(ctx, recKey, rec), nil
}

// Progressed is j as its worker's progress shows it (WithProgress): running from the send of
// its attempt, with the attempts, backend and tokens so far.
func (c *Core) Progressed(ctx context.Context, j *View) *View {
	if !j.Running() {
		return j
	}
	return c.progressed(ctx, j.key, j.rec)
}

func (c *Core) progressed(ctx context.Context, key string, rec *kv.Record) *View {
	rec, p := c.WithProgress(ctx, key, rec)
	j := viewOf(key, rec)
	if p != nil {
		j.Sent = p.Sent
	}
	return j
}

// CancelJob cancels tenant's job id (Cancel) and returns it as it stands afterwards.
func (c *Core) CancelJob(ctx context.Context, tenant, id string, errorBody func(api string) []byte) (*View, error) {
	rec, err := c.Cancel(ctx, tenant, id, errorBody)
	if err != nil {
		return nil, err
	}
	return viewOf("", rec), nil
}
