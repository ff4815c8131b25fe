package jobs_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/jobs"
)

// TestLocalFeed: a local feed hands its writer's chunks to its follower in order, the first
// and the terminal one with the meta; a feed whose follower left takes further chunks without
// error (the execution goes on); the hub's Close ends a follower still waiting.
func TestLocalFeed(t *testing.T) {
	_, hub := setup(t)
	ctx := context.Background()
	fl, out, err := hub.Local(jobs.ChunkSubject("local-feed", "job", 1))
	if err != nil {
		t.Fatal(err)
	}
	out.SetMeta(jobs.Meta{Backend: "b", Attempts: 2})
	for _, p := range []string{"a", "b"} {
		if err := out.Publish(ctx, jobs.KindData, 0, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := out.PublishRetry(ctx, jobs.KindError, http.StatusServiceUnavailable, []byte("e"), 3); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, fl)
	if len(got) != 3 || string(got[0].Payload) != "a" || string(got[1].Payload) != "b" || got[2].Kind != jobs.KindError {
		t.Fatalf("chunks %+v, want a, b, error", got)
	}
	for i, c := range got {
		wantMeta := i != 1
		if c.Idx != i || (c.Meta.Backend == "b") != wantMeta {
			t.Errorf("chunk %d: idx %d meta %+v (meta expected: %v)", i, c.Idx, c.Meta, wantMeta)
		}
	}
	if got[2].Status != http.StatusServiceUnavailable || got[2].Meta.RetryAfter != 3 || out.Next() != 3 || !out.ExpiresAlone() {
		t.Errorf("terminal %+v, next %d", got[2], out.Next())
	}
	if hub.Following(jobs.ChunkSubject("local-feed", "job", 1)) {
		t.Error("the hub still follows a local feed that ended")
	}

	left, out2, err := hub.Local(jobs.ChunkSubject("left", "job", 1))
	if err != nil {
		t.Fatal(err)
	}
	left.Close()
	if err := out2.Publish(ctx, jobs.KindResult, http.StatusOK, []byte("{}")); err != nil {
		t.Fatalf("publish after the follower left: %v", err)
	}

	waiting, _, err := hub.Local(jobs.ChunkSubject("waiting", "job", 1))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := waiting.Next(ctx)
		done <- err
	}()
	hub.Close()
	if err := <-done; !errors.Is(err, jobs.ErrHubClosed) {
		t.Fatalf("a waiting follower after the hub's Close: %v, want ErrHubClosed", err)
	}
	if _, _, err := hub.Local(jobs.ChunkSubject("late", "job", 1)); !errors.Is(err, jobs.ErrHubClosed) {
		t.Fatalf("Local on a closed hub: %v, want ErrHubClosed", err)
	}
}
