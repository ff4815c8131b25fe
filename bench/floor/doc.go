// Package floor measures the floor under what a new intent costs oncegate: the JetStream
// operations the design cannot do without, run with nothing else around them: no HTTP, no
// backend call, no JSON, no ledger chain, progress, job index, tracing or metrics. Issue 16
// compares the gateway's CPU per new intent with Bifrost's, a proxy that stores nothing; this
// package says how much of that a pipeline built on the fixed points (a claim in a KV bucket,
// a job message deduplicated by Nats-Msg-Id, a terminal chunk the copies follow, the outcome in
// the record, a ledger charge) spends in NATS alone, on the same machine.
//
//	go test -run XXX -bench '^BenchmarkNewIntent$' -benchtime 5s -count 3 ./bench/floor/
//
// BenchmarkClusterIntent runs the same stored operations on a three-server R3 cluster in this
// process (issue 44's cluster floor: what a replicated intent must cost, the servers' CPU
// summed), synced and with `sync: 1s`, at c=64 (CPU per intent) and c=1 (latency per intent):
//
//	go test -run XXX -bench ClusterIntent -benchtime 5s -count 3 ./bench/floor/
//
// bench/cluster-cost.sh measures the gateway itself on one node and on three.
//
// It has benchmarks only (and the leak check every package has); the one-server figures are in
// BENCHMARKS.md, round 4, "The floor under a new intent".
package floor
