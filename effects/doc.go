// Package effects is the effects ledger: a record per side effect a caller drives from an
// intent's answer (a tool call, a row written, a card charged, a message sent), so the effect
// runs once however often the caller's whole loop is retried. oncegate replays an intent's
// answer byte for byte, its tool-call ids and arguments included, so an effect named after a
// tool call of that answer has a name that is stable across retries; this package keeps what
// became of it.
//
// An entry lives in the OG_EFFECTS JetStream key-value bucket, replicated like the records
// (IDEM), with the idempotency TTL, under a key made of hashes only: the tenant's, the
// intent's record key (already a hash) and the effect's key (EffectKey: a hash of the three,
// which the caller also passes downstream as that system's own idempotency key). No client
// text becomes a subject.
//
// An entry is claimed (a caller runs the effect, under a lease and a fence), completed (its
// result, stored byte for byte, is replayed to every later claim), needs_reconcile (the
// caller said it cannot tell whether the effect ran, or a claim's lease ran out before it
// completed: nobody may run it again until someone has looked) or released (the caller said
// the effect surely did not run: the next claim runs it). The rules are the pure functions
// of rules.go; the Store reads an entry from the bucket stream's leader, decides, and writes
// by compare-and-set on the entry's revision, so of two concurrent writers one wins and the
// other decides again on what the winner wrote. The fence is a number raised by every claim:
// a completion or an unknown report must name the current one, so the holder of a lapsed
// claim can no longer write.
//
// NATS errors do not leave the package: callers branch on its sentinels (ErrFingerprint,
// ErrInProgress, ErrNeedsReconcile, ErrStaleFence, ErrCompleted, ErrNotFound,
// ErrUnavailable). A Store is safe for concurrent use.
package effects
