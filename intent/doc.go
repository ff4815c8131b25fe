// Package intent is the exactly-once core: one intent's life across the idempotency record
// (kv) and the job plumbing (jobs). It decides what a request is attached to (a new execution,
// a live one it joins, a stored outcome it replays, its own bypass execution, or a refusal),
// moves an execution whose owner vanished to a new epoch (TakeOver), cancels and releases, and
// follows an execution for one client to its end (Delivery: the chunks of its epoch, a
// takeover before any output, the record when a terminal chunk never comes). It knows nothing
// of HTTP or of providers: httpapi copies a request into an owned Request, asks, and answers
// from what it is given (Delivery events, Views of a record), never from the record or the
// chunks themselves; workers call TakeOver on a redelivered job.
package intent
