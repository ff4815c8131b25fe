package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/ledger"
)

// BenchmarkAppend measures charges per second on the embedded server with synced writes (every
// append is one fsynced JetStream write plus the in-memory id check):
//
//	go test -run XXX -bench Append -benchtime 3s ./ledger/
func BenchmarkAppend(b *testing.B) {
	b.Run("one tenant serial", func(b *testing.B) {
		srv := start(b)
		ctx := ctxT(b)
		l := ledger.New(srv.JS, testPrices, "USD")
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: fmt.Sprintf("k%d", i), JobID: j1, Epoch: 1,
				Model: "gpt-4o-mini", InputTokens: 100, OutputTokens: 10}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "charges/s")
	})
	b.Run("one tenant 4 processes", func(b *testing.B) {
		// Four Ledgers on four connections contend for one chain (expected-sequence conflicts).
		srv := start(b)
		ctx := ctxT(b)
		ls := make([]*ledger.Ledger, 4)
		for i := range ls {
			_, js := srv.Conn(b)
			ls[i] = ledger.New(js, testPrices, "USD")
		}
		chargeOneTenant(ctx, b, ls, 1) // GOMAXPROCS goroutines, spread over the four ledgers
	})
	// One tenant's charges from 32 goroutines (a worker's slots finishing together) on a
	// three-node in-process cluster with LEDGER at three replicas and every write synced
	// (sync: always), committed in atomic batches, against the same on a LEDGER without atomic
	// publishes (one by one):
	//
	//	go test -run XXX -bench 'Append/one_tenant_32' -benchtime 3s -count 3 ./ledger/
	//
	// (On one replica the ledger appends one by one whatever the stream allows; see
	// atomicBatches.)
	for _, batched := range []bool{true, false} {
		name := "one tenant 32 goroutines R3 batched"
		if !batched {
			name = "one tenant 32 goroutines R3 one by one"
		}
		b.Run(name, func(b *testing.B) {
			_, js := testkit.RunCluster(b, 3, testkit.SyncAlways()).Connect(b)
			ctx := ctxT(b)
			cfg := ledger.StreamConfig()
			cfg.AllowAtomicPublish, cfg.Replicas = batched, 3
			if _, err := js.CreateStream(ctx, cfg); err != nil {
				b.Fatal(err)
			}
			chargeOneTenant(ctx, b, []*ledger.Ledger{ledger.New(js, testPrices, "USD")}, 16) // 32 goroutines on 2 cores
		})
	}
	b.Run("tenant per goroutine", func(b *testing.B) {
		srv := start(b)
		ctx := ctxT(b)
		l := ledger.New(srv.JS, testPrices, "USD")
		var n, w atomic.Int64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			tenant := fmt.Sprintf("t%d", w.Add(1))
			for pb.Next() {
				if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: tenant, KeyHash: fmt.Sprintf("k%d", n.Add(1)), JobID: j1, Epoch: 1,
					Model: "gpt-4o-mini", InputTokens: 100, OutputTokens: 10}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "charges/s")
	})
}

// chargeOneTenant charges tenant acme b.N times from parallelism × GOMAXPROCS goroutines spread
// over ls, and reports charges per second.
func chargeOneTenant(ctx context.Context, b *testing.B, ls []*ledger.Ledger, parallelism int) {
	var n, w atomic.Int64
	b.ResetTimer()
	b.SetParallelism(parallelism)
	b.RunParallel(func(pb *testing.PB) {
		l := ls[w.Add(1)%int64(len(ls))]
		for pb.Next() {
			if _, err := l.Charge(ctx, ledger.ChargeInput{Tenant: "acme", KeyHash: fmt.Sprintf("k%d", n.Add(1)), JobID: j1, Epoch: 1,
				Model: "gpt-4o-mini", InputTokens: 100, OutputTokens: 10}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "charges/s")
}
