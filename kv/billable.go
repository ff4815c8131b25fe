package kv

import "net/http"

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

// Billable reports whether a finished record has something to charge: an answer (COMPLETED
// with status 200 after at least one backend attempt), the partial output of a failed stream,
// or unfinished attempts. Refusals, client errors, releases and degraded answers produced no
// billable output.
func (r *Record) Billable() bool {
	if r.State == Pending {
		return false
	}
	if len(r.Unfinished) > 0 {
		return true
	}
	res := r.Result
	if res == nil || res.Attempts == 0 {
		return false
	}
	return (r.State == Completed && res.Status == http.StatusOK) || (r.State == Failed && res.Partial)
}

// AddUnfinished records in r the attempts of progress p as unfinished (epoch p.Epoch ends
// without an outcome) and counts them in Attempts. A p of another job or
// with nothing sent adds nothing. It is how a takeover and a cancel keep an attempt the
// backend may have run and billed: counted and reported, never hidden.
func (r *Record) AddUnfinished(p *Progress, cancelled bool) {
	if p == nil || p.JobID != r.JobID || p.Attempt == 0 {
		return
	}
	for _, u := range r.Unfinished {
		if u.Epoch == p.Epoch {
			return
		}
	}
	r.Unfinished = append(r.Unfinished, Unfinished{Epoch: p.Epoch, Attempts: p.Attempt, Backend: p.Backend,
		Tokens: p.Tokens, RequestBytes: len(r.Request), Cancelled: cancelled})
	r.Attempts += p.Attempt
}
