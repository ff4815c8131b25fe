package kv

import (
	"context"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestBucketMaxAgeKeepsTheTTLWhenUnsure: a cold tier's store (HotTTL below TTL) is made with
// the hot TTL only when its bucket does not exist. An existing bucket that keeps the TTL keeps
// it, and so does one whose read failed (here: a context already cancelled): lowering a
// bucket whose records are not yet in the cold tier would expire them uncopied.
func TestBucketMaxAgeKeepsTheTTLWhenUnsure(t *testing.T) {
	s := testkit.RunJetStream(t, 0)
	ctx := context.Background()
	cold := BucketConfig{TTL: time.Hour, HotTTL: time.Minute}
	if got := bucketMaxAge(ctx, s.JS, BucketStream, cold); got != time.Minute {
		t.Errorf("no bucket yet: MaxAge %s, want the hot TTL", got)
	}
	if _, err := Open(ctx, s.JS, BucketConfig{TTL: time.Hour}); err != nil { // a store without a cold tier
		t.Fatal(err)
	}
	if got := bucketMaxAge(ctx, s.JS, BucketStream, cold); got != time.Hour {
		t.Errorf("a bucket keeping the TTL: MaxAge %s, want the TTL", got)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if got := bucketMaxAge(cancelled, s.JS, BucketStream, cold); got != time.Hour {
		t.Errorf("a failed read: MaxAge %s, want the TTL", got)
	}
}
