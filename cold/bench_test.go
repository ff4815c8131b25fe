package cold_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
)

// BenchmarkMove is the cold tier's sustained rate: b.N records of 1.44 KB (a completed record's
// size) written into the hot bucket first, then the time until one node's mover has copied
// them and its applier has indexed them (its watermark passes the last write), on a server
// synced once a second. records/s is what a node's mover and applier keep up with; the
// gateway admits far fewer new keys per second (about 1,100 on one node of this machine).
func BenchmarkMove(b *testing.B) {
	srv := testkit.RunJetStream(b, time.Second)
	ctx := context.Background()
	if _, err := srv.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "IDEM", TTL: time.Hour, History: 1}); err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 1440)
	var key [16]byte
	for i := 0; i < b.N; i++ {
		_, _ = rand.Read(key[:])
		if _, err := srv.JS.PublishAsync("$KV.IDEM."+hex.EncodeToString(key[:]), value); err != nil {
			b.Fatal(err)
		}
		if i%1000 == 999 {
			<-srv.JS.PublishAsyncComplete()
		}
	}
	select {
	case <-srv.JS.PublishAsyncComplete():
	case <-time.After(5 * time.Minute):
		b.Fatal("the hot records were not acknowledged")
	}
	written := time.Now()
	b.ResetTimer()
	tier, _ := run(b, srv.JS, filepath.Join(b.TempDir(), "cold"), time.Hour)
	testkit.CheckFor(b, 10*time.Minute, 10*time.Millisecond, func() error {
		if !tier.Watermark().After(written) {
			return fmt.Errorf("watermark %v, last write %v", tier.Watermark(), written)
		}
		return nil
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
