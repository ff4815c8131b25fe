package ledger_test

import (
	"fmt"
	"sync/atomic"
	"testing"

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
		var n, w atomic.Int64
		b.ResetTimer()
		b.SetParallelism(1) // GOMAXPROCS goroutines, spread over the four ledgers
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
	})
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
