package jobs

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestSweepPrefixDeletesAFailedFollowsConsumers: the consumers a failed follow may have left
// (named with its try's prefix, whatever their serial) are deleted; another follow's, with a
// prefix that merely starts the same, are not. The sweep's goroutine ends when the hub closes.
func TestSweepPrefixDeletesAFailedFollowsConsumers(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	if err := EnsureStreams(ctx, srv.JS, StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tryA_1", "tryA_2", "tryAB_1", "other_1"} {
		if _, err := srv.JS.CreateConsumer(ctx, ChunksStream, jetstream.ConsumerConfig{Name: name,
			FilterSubject: ChunkSubject(name, "job", 1), AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: 10 * time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	h := NewHub(srv.NC, srv.JS, zerolog.Nop(), HubOptions{})
	h.sweepPrefix(ChunkSubject("k", "job", 1), "tryA")
	left := func() []string {
		st, err := srv.JS.Stream(ctx, ChunksStream)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		l := st.ConsumerNames(ctx)
		for n := range l.Name() {
			names = append(names, n)
		}
		if err := l.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		return names
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got := left(); !slices.Equal(got, []string{"other_1", "tryAB_1"}) {
			return fmt.Errorf("consumers left: %v, want other_1 and tryAB_1", got)
		}
		return nil
	})
	h.Close() // ends the sweep's further looks (goleak checks)
}
