// Package retention measures what a retained completed key costs the gateway's process: the
// memory that grows with the keys the IDEM bucket keeps for the TTL (issue 36's "memory per
// retained completed key"), in the embedded server's indexes and the Go heap, with every key
// written as the gateway writes it (a claim, then the final record), and checks that the
// oldest and the newest key still replay byte-identical afterwards.
//
//	go test -run TestRetention -retention.keys 1000000 -v -timeout 30m ./bench/retention/
//
// It measures nothing unless -retention.keys is set (a million keys take minutes and a
// gigabyte); the figures are in BENCHMARKS.md.
package retention
