package intent

import (
	"context"
	"net/http"

	"github.com/oncegate/oncegate/kv"
)

// AvoidedCounter keeps a count of executions avoided (ledger.Tally, durable for the bills).
type AvoidedCounter interface {
	Avoided(tenant, model string, joined bool, savedMicros int64)
}

// Avoided counts a's request as an execution avoided, with the money it saved, once its
// answer has been given: a replay, or a join of a live execution (priced once that execution
// ended, from the usage in its record; a join whose record is still pending reads it once).
// A created, bypassed or re-driven admission avoided nothing and counts nothing. It counts in
// the metrics (per process) and in the tally (durable, for the bills).
func (a *Admission) Avoided(ctx context.Context) {
	if a == nil || (a.core.metrics == nil && a.core.tally == nil) {
		return
	}
	joined := a.Outcome == Joined
	if (!joined || a.redriven) && a.Outcome != Replayed {
		return
	}
	rec := a.Rec
	if joined && (rec == nil || rec.State == kv.Pending) {
		if r, _, err := a.core.storeOf(a.Key).Get(ctx, a.Key); err == nil {
			rec = r
		}
	}
	if rec == nil {
		return
	}
	saved := a.core.savedMicros(rec)
	a.core.metrics.Avoided(rec.Tenant, rec.Model, joined, saved)
	if a.core.tally != nil {
		a.core.tally.Avoided(rec.Tenant, rec.Model, joined, saved)
	}
}

// savedMicros is what the execution of rec was charged for its answer, priced the way the
// ledger prices it, from the backend's usage: 0 without usage, or for an answer the ledger
// does not charge (a refusal, a client error, a degraded answer).
func (c *Core) savedMicros(rec *kv.Record) int64 {
	res := rec.Result
	if res == nil || res.Usage == nil || res.Attempts == 0 || res.Degraded {
		return 0
	}
	if !(rec.State == kv.Completed && res.Status == http.StatusOK) && !(rec.State == kv.Failed && res.Partial) {
		return 0
	}
	return c.prices.Cost(rec.Model, res.Usage.PromptTokens, res.Usage.CompletionTokens)
}
