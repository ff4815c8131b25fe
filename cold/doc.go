// Package cold is the idempotency store's cold tier (issue 46): the records that left the hot
// IDEM bucket (which keeps a key for idempotency.hot_ttl) kept until idempotency.ttl at a few
// bytes of memory per key.
//
// NATS stays the replicated source of truth: the OG_COLD stream holds a copy of every IDEM
// message older than about half the hot TTL, on a handful of subjects (og.cold.r.<hour> for
// records, og.cold.mark for the mover's watermark), so nats-server's per-subject index stays a
// few entries whatever the key count. Three parts:
//
//   - the mover (Tier.Run, on every node; the node whose marks keep coming does the rounds,
//     another takes over when they stop, and a compare-and-set on the mark subject makes one
//     of two racing rounds win) copies IDEM messages in stream order once they are older than MoveAfter, with
//     Nats-Msg-Id key.revision, deletes and purges as tombstones, then publishes a mark:
//     "every IDEM message up to sequence S, and every one written before W, is in OG_COLD";
//   - the applier (every node, one ordered consumer) applies OG_COLD in order into a local
//     Pebble index, key hash -> (OG_COLD sequence, revision, write time), in per-hour key
//     ranges dropped whole once past the TTL; the index stores the stream sequence it applied
//     and the last mark's W in the same batch, resumes from them, and is rebuilt from OG_COLD
//     when its files are missing or unreadable;
//   - Lookup answers from the local index alone (no NATS request), Read fetches a record by
//     its OG_COLD sequence, and Ready says whether the local index may answer "not here":
//     only when its applied W is within Margin of now - hot TTL, so that every key that could
//     have left the hot tier has been applied here. Otherwise ErrBehind (503 store_unavailable).
//
// A Tier is safe for concurrent use; Run must be called once.
package cold
