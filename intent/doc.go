// Package intent is the exactly-once core: one intent's life across the idempotency record
// (kv) and the job plumbing (jobs). It decides what a request is attached to (a new execution,
// a live one it joins, a stored outcome it replays, its own bypass execution, or a refusal),
// moves an execution whose owner vanished to a new epoch (TakeOver), cancels and releases.
// It knows nothing of HTTP or of providers: httpapi copies a request into an owned Request and
// asks; workers call TakeOver on a redelivered job.
package intent
