package ledger

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestRepeatFoundFromAfter: a charge repeated after the id index forgot it and past the stream's
// Nats-Msg-Id window is still found, in the stream, when the append says since when it could
// exist (ChargeInput.After); so is a continuation of it. The control at the end shows that
// without After nothing else would have caught the repeat here.
func TestRepeatFoundFromAfter(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := StreamConfig()
	cfg.Duplicates = 100 * time.Millisecond // shorter than the test's pause: the window cannot catch the repeat
	if _, err := srv.JS.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// A nanosecond horizon: each append forgets the ids before it.
	l := New(srv.JS, Prices{"m": {InputPerMillion: 1_000_000}}, "USD", WithDedupHorizon(time.Nanosecond))
	in := ChargeInput{Tenant: "acme", KeyHash: "0123456789abcdef0123456789abcdef", JobID: "01J00000000000000000000001", Epoch: 1, Attempt: 1, Model: "m", InputTokens: 10}
	stored := time.Now() // the outcome is stored, then charged
	first, err := l.Charge(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	other := in
	other.JobID = "01J00000000000000000000002"
	if _, err := l.Charge(ctx, other); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // past the Nats-Msg-Id window
	before := msgs(ctx, t, l)

	repeat := in
	repeat.After = stored
	again, err := l.Charge(ctx, repeat)
	if err != nil || again.Seq != first.Seq || msgs(ctx, t, l) != before {
		t.Fatalf("repeat with After: seq %d (first %d), err %v, %d entries (before %d)", again.Seq, first.Seq, err, msgs(ctx, t, l), before)
	}
	cont := ChargeInput{Tenant: "acme", Attempt: 1, InputTokens: 5, After: stored}
	if _, err := l.Continuation(ctx, first.ID, cont); err != nil {
		t.Fatalf("continuation of a charge the index forgot: %v", err)
	}

	// Control: the same repeat without After, from a fresh process, is written a second time.
	fresh := New(srv.JS, Prices{"m": {InputPerMillion: 1_000_000}}, "USD", WithDedupHorizon(time.Nanosecond))
	n := msgs(ctx, t, l)
	dup, err := fresh.Charge(ctx, in)
	if err != nil || dup.Seq == first.Seq || msgs(ctx, t, l) != n+1 {
		t.Fatalf("control without After: seq %d (first %d), err %v, %d entries (before %d); the test no longer isolates After", dup.Seq, first.Seq, err, msgs(ctx, t, l), n)
	}
}

// TestNewChargeReadsNoStream: once the id index has forgotten older ids (the dedup horizon),
// a new charge whose After is inside what the index still holds is written without reading
// the tenant's entries from the stream: its id cannot be there. Before, every such charge read
// a minute or more of entries under the chain lock, and the soak's workers queued on it.
func TestNewChargeReadsNoStream(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := srv.JS.CreateStream(ctx, StreamConfig()); err != nil {
		t.Fatal(err)
	}
	l := New(srv.JS, Prices{"m": {InputPerMillion: 1_000_000}}, "USD", WithDedupHorizon(time.Nanosecond))
	in := ChargeInput{Tenant: "acme", KeyHash: "0123456789abcdef0123456789abcdef", JobID: "01J00000000000000000000001", Epoch: 1, Attempt: 1, Model: "m", InputTokens: 10}
	for _, job := range []string{"01J00000000000000000000001", "01J00000000000000000000002"} {
		in.JobID = job
		if _, err := l.Charge(ctx, in); err != nil { // the second forgets the first: the index is partial
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	fresh := in
	fresh.JobID, fresh.After = "01J00000000000000000000003", time.Now().Add(2*clockMargin)
	before := l.scans.Load()
	if _, err := l.Charge(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if n := l.scans.Load() - before; n != 0 {
		t.Fatalf("a new charge read the stream %d times", n)
	}
	// Control: an After older than what the index holds still reads the stream.
	old := in
	old.JobID, old.After = "01J00000000000000000000004", time.Now().Add(-time.Hour)
	before = l.scans.Load()
	if _, err := l.Charge(ctx, old); err != nil {
		t.Fatal(err)
	}
	if l.scans.Load() == before {
		t.Fatal("a charge whose After is older than the index read nothing: the test no longer isolates the rule")
	}
}

// TestRepeatReadLeavesTheChainFree: a repeat charge that must read the tenant's older entries
// (its After is older than the index) reads them without holding the tenant's chain lock, so
// other charges of the tenant are appended meanwhile. Before, the read ran under the lock: in
// row 18's soak a restarted worker's charge sweep held every worker's charges up for minutes.
func TestRepeatReadLeavesTheChainFree(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := srv.JS.CreateStream(ctx, StreamConfig()); err != nil {
		t.Fatal(err)
	}
	l := New(srv.JS, nil, "USD", WithDedupHorizon(time.Nanosecond)) // the index forgets every older id
	in := ChargeInput{Tenant: "acme", KeyHash: "0123456789abcdef0123456789abcdef", Epoch: 1, Attempt: 1, Model: "m", InputTokens: 10}
	const older = 3000 // enough entries that reading them takes a while
	for i := range older {
		in.JobID = fmt.Sprintf("01J%023d", i)
		if _, err := l.Charge(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	c := l.chain("acme")
	repeat := in
	repeat.JobID, repeat.After = "01JNEVERSTORED0000000000000", time.Now().Add(-time.Hour) // read them all, find nothing
	before := l.scans.Load()
	done := make(chan error, 1)
	go func() {
		_, err := l.Charge(ctx, repeat)
		done <- err
	}()
	for l.scans.Load() == before {
		select {
		case err := <-done:
			t.Fatalf("the repeat charge ended (%v) without reading the stream: the test no longer isolates the read", err)
		case <-time.After(time.Millisecond):
		}
	}
	// The read has started: the chain must be free now, while the read goes on.
	if err := c.mu.LockCtx(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		c.mu.Unlock()
		t.Fatalf("the chain lock was only free once the repeat charge had ended (%v): it read the stream under the lock", err)
	default:
	}
	c.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
