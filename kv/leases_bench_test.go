package kv_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/kv"
)

// BenchmarkLeaseSweep is one sweep's read (LeaseWatch.Expired) of the 2,048 records written
// since the last one, on a bucket already holding `keys` keys (the TTL's worth): what a sweep
// costs as the bucket grows. The writes are not timed.
//
//	go test -run XXX -bench LeaseSweep -benchtime 20x ./kv
func BenchmarkLeaseSweep(b *testing.B) {
	for _, keys := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			srv := testkit.RunJetStream(b, time.Second)
			ctx := context.Background()
			st, err := kv.Open(ctx, srv.JS, kv.BucketConfig{TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			// Records as a claim writes them (headers and all), published without waiting for
			// each ack so that the bucket fills in seconds.
			rec := &kv.Record{State: kv.Completed, Tenant: "t", JobID: "J", Epoch: 1, Fingerprint: "fp", Owner: "o"}
			data, err := kv.Encode(rec)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			write := func(count int) {
				b.Helper()
				for range count {
					if _, err := st.ClaimEncoded(ctx, fmt.Sprintf("k%09d", n), rec, data); err != nil {
						b.Fatal(err)
					}
					n++
				}
			}
			write(keys)
			w := st.WatchLeases()
			defer w.Close(ctx)
			if _, err := w.Expired(ctx, time.Now()); err != nil { // the first, full read
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				write(2048)
				b.StartTimer()
				if _, err := w.Expired(ctx, time.Now()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
