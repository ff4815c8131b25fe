package kv

import "net/http"

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
