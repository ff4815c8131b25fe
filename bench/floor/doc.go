// Package floor measures the floor under what a new intent costs oncegate: the JetStream
// operations the design cannot do without, run with nothing else around them: no HTTP, no
// backend call, no JSON, no ledger chain, progress, job index, tracing or metrics. Issue 16
// compares the gateway's CPU per new intent with Bifrost's, a proxy that stores nothing; this
// package says how much of that a pipeline built on the fixed points (a claim in a KV bucket,
// a job message deduplicated by Nats-Msg-Id, a terminal chunk the copies follow, the outcome in
// the record, a ledger charge) spends in NATS alone, on the same machine.
//
//	go test -run XXX -bench . -benchtime 5s -count 3 ./bench/floor/
//
// It has benchmarks only (and the leak check every package has); the figures are in
// BENCHMARKS.md, round 4, "The floor under a new intent".
package floor
