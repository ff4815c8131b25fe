package ledger

import "sync"

const (
	// OutputWindow is how many of a model's latest answers Outputs keeps.
	OutputWindow = 256
	// OutputMinAnswers is how many answers of a model Outputs needs before it estimates: with
	// fewer, a request without max_tokens is sized by the configured default.
	OutputMinAnswers = 8
	// outputMaxModels bounds the models Outputs follows (a catch-all route lets clients name
	// any model); a model beyond it is never estimated, so it keeps the default.
	outputMaxModels = 1024
)

// Outputs estimates the output tokens of a request that sets no max_tokens, per model, from
// the answers the ledger charged: the most any of the model's last OutputWindow completed
// answers returned (its charge and continuations), once it has seen OutputMinAnswers of them.
// The maximum, not a lower percentile: a reservation smaller than the answer is the one way
// an estimate can let a tenant's spend pass its limit (Budgets).
//
// It learns from the entries a node's Budgets read (the budgeted tenants' charges, which the
// first read of each tenant after a start takes from the period's beginning), so each node has
// its own: an estimate only sizes a reservation, and the reservations themselves are shared by
// every node. It is safe for concurrent use.
type Outputs struct {
	mu     sync.Mutex
	models map[string]*outputRing
}

// outputRing is a model's latest answers, oldest overwritten first.
type outputRing struct {
	ids    [OutputWindow]string // charge id, for the continuations that add to it
	tokens [OutputWindow]int
	next   int // the slot written next
	n      int // slots in use
}

// NewOutputs is an empty estimator.
func NewOutputs() *Outputs { return &Outputs{models: map[string]*outputRing{}} }

// Observe counts e: a completed charge is one more answer of its model; a continuation adds its
// output to the answer of the charge it continues, while that is among the latest. Reversals,
// and charges of attempts cut off (not completed), say nothing of what the model returns.
func (o *Outputs) Observe(e *Entry) {
	if o == nil || e.Model == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.models[e.Model]
	switch {
	case e.Kind == KindCharge && e.Completed:
		if r == nil {
			if len(o.models) >= outputMaxModels {
				return
			}
			r = &outputRing{}
			o.models[e.Model] = r
		}
		r.ids[r.next], r.tokens[r.next] = e.ID, max(e.OutputTokens, 0)
		r.next = (r.next + 1) % OutputWindow
		r.n = min(r.n+1, OutputWindow)
	case e.Kind == KindContinuation && r != nil:
		for k := 1; k <= r.n; k++ { // newest first: a continuation follows its charge closely
			i := (r.next - k + OutputWindow) % OutputWindow
			if r.ids[i] == e.Refers {
				r.tokens[i] += max(e.OutputTokens, 0)
				return
			}
		}
	}
}

// Estimate is the most output tokens any of model's latest answers had; ok is false while
// fewer than OutputMinAnswers were seen.
func (o *Outputs) Estimate(model string) (tokens int, ok bool) {
	if o == nil {
		return 0, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	r := o.models[model]
	if r == nil || r.n < OutputMinAnswers {
		return 0, false
	}
	for i := range r.n {
		tokens = max(tokens, r.tokens[i])
	}
	return tokens, true
}
