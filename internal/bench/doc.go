// Package bench is `oncegate bench`, a load tool for any OpenAI-compatible chat completions
// endpoint — an oncegate gateway, oncegate's mock, or another server — in the way `nats bench`
// and `redis-benchmark` ship with their servers.
//
// A run ([Run] with a [Config]) sends POST <url>/v1/chat/completions, non-stream or stream,
// in a closed loop (Concurrency workers, each starting its next intent when the last one
// finished) or an open loop (Rate intents per second, Concurrency in flight at most), for a
// warm-up and then a measured Duration. With a second target (CompareURL) the measured time
// is cut into short slices run alternately on A and B, so that machine noise hits both.
//
// Scenarios ([Scenarios]) decide what one intent is:
//
//	overhead     one request, a new intent each time (unique Idempotency-Key)
//	duplicates   Copies identical requests released together, with or without a key
//	retry-storm  one call of an SDK-like client: short per-attempt timeout, 2 retries with
//	             the SDKs' backoff, x-stainless-retry-count, x-should-retry / Retry-After honored
//	fanout       one long stream plus Subscribers late copies of it (same key, stream: true);
//	             per-chunk delivery lag against the first stream
//	replay       KeysPool intents completed first, then requested again
//
// A [Report] gives requests/s, latency percentiles (nearest rank), time to first and last
// token for streams, errors by [ErrorKind], the gateway's Oncegate-Idempotency answers and,
// with an execution counter (the mock's GET /stats, read before and after every measured
// slice), backend executions per request and per intent. [WriteTable] and [WriteJSON] print
// it.
//
// Safety: targets must be loopback addresses unless AllowRemote ([CheckTarget], and the
// dialer refuses anything else too); every run is bounded in time (Duration ≤ 10 minutes
// without AllowLong, a per-request Timeout, a time budget for the whole run) and in count
// (MaxRequests per target).
//
// Concurrency: Run owns every goroutine it starts and joins them before it returns; a Run
// shares nothing with another Run.
package bench
