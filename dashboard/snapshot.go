package dashboard

import (
	"time"

	"github.com/oncegate/oncegate/internal/telemetry"
)

// Row caps of one process's snapshot: a snapshot stays a few tens of kilobytes whatever the
// load, and the view says how many rows it left out.
const (
	MaxExecutions = 200
	MaxFollows    = 500
	MaxEvents     = 20
	MaxMoneyRows  = 200
)

// Outcomes counted per tenant, in telemetry's order: created, joined, replayed, bypassed,
// conflict.
const NumOutcomes = int(telemetry.Conflict) + 1

// OutcomeNames are the outcomes of Counts.Outcomes, in order.
var OutcomeNames = [NumOutcomes]string{"created", "joined", "replayed", "bypassed", "conflict"}

// Snapshot is one process's part of the cluster, as it posted it.
type Snapshot struct {
	Node  string    `json:"node"`
	Roles string    `json:"roles"`
	At    time.Time `json:"at"`
	// Started is when the process began counting (its publisher was made): a hub's history
	// counts a process started after the history began from zero.
	Started time.Time `json:"started"`
	// Counts are the process's request outcomes and added latency per tenant, since it started.
	Counts []Counts `json:"counts,omitempty"`
	// Money is spend today (UTC) and what the avoided executions saved, per tenant and model.
	Money []Money `json:"money,omitempty"`
	// Executions are the executions this process's workers run now (at most MaxExecutions of
	// ExecutionsTotal).
	Executions      []Execution `json:"executions,omitempty"`
	ExecutionsTotal int         `json:"executions_total,omitempty"`
	// Follows are the copies following live executions on this API process.
	Follows      []Follow  `json:"follows,omitempty"`
	FollowsTotal int       `json:"follows_total,omitempty"`
	Backends     []Backend `json:"backends,omitempty"`
	// Events are the latest failures and takeovers, newest first.
	Events []Event `json:"events,omitempty"`
}

// Counts are one tenant's counters on one process.
type Counts struct {
	Tenant   string             `json:"tenant"`
	Outcomes [NumOutcomes]int64 `json:"outcomes"`
	// AddedNanos and AddedCount: the added latency of created requests (sum and count).
	AddedNanos int64 `json:"added_ns,omitempty"`
	AddedCount int64 `json:"added_n,omitempty"`
	Reversals  int64 `json:"reversals,omitempty"`
}

// Money is one tenant's and model's money on one process.
type Money struct {
	Tenant string `json:"tenant"`
	Model  string `json:"model"`
	// SpendMicros is what was charged today (UTC), in ledger micro-units.
	SpendMicros int64 `json:"spend_micros"`
	// Joined and Replayed count the executions avoided; SavedMicros what they saved.
	Joined      int64 `json:"joined"`
	Replayed    int64 `json:"replayed"`
	SavedMicros int64 `json:"saved_micros"`
}

// Execution is one execution a worker runs.
type Execution struct {
	JobID   string `json:"job_id"`
	Tenant  string `json:"tenant"`
	Model   string `json:"model"`
	Backend string `json:"backend,omitempty"`
	Worker  string `json:"worker"`
	Node    string `json:"node,omitempty"`
	Epoch   int    `json:"epoch"`
	Attempt int    `json:"attempt,omitempty"`
	Tokens  int    `json:"tokens"`
	Stream  bool   `json:"stream,omitempty"`
	// Started is when this epoch started on its worker; LeaseUntil when its lease runs out
	// unless renewed.
	Started    time.Time `json:"started"`
	LeaseUntil time.Time `json:"lease_until"`
}

// Follow is how many copies follow one live execution on one API process.
type Follow struct {
	JobID  string `json:"job_id"`
	Tenant string `json:"tenant"`
	// Joined counts the copies that joined (the creator is not one); Copies every copy.
	Joined int `json:"joined"`
	Copies int `json:"copies"`
}

// Backend is one backend as one worker process sees it.
type Backend struct {
	Name    string `json:"name"`
	Breaker string `json:"breaker"`
	// Requests and Failures are the breaker's window.
	Requests uint32 `json:"requests"`
	Failures uint32 `json:"failures"`
	// BudgetRequests, Retries and RetriesRefused are the retry budget's lifetime counters.
	BudgetRequests int64 `json:"budget_requests"`
	Retries        int64 `json:"retries"`
	RetriesRefused int64 `json:"retries_refused"`
	// LatencyMillis is the median time to a backend's answer (its response headers) over its
	// latest answers; 0 when none was seen.
	LatencyMillis float64 `json:"latency_ms,omitempty"`
}

// Event is a failure or a takeover.
type Event struct {
	At     time.Time `json:"at"`
	Kind   string    `json:"kind"` // "failed" or "takeover"
	JobID  string    `json:"job_id"`
	Tenant string    `json:"tenant"`
	Model  string    `json:"model,omitempty"`
	Node   string    `json:"node,omitempty"`
	Reason string    `json:"reason"`
}

// Event kinds.
const (
	EventFailed   = "failed"
	EventTakeover = "takeover"
)
