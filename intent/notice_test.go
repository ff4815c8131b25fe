package intent_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
)

// TestNoticeOutcome: on a node whose hub follows notices (one server), a new non-stream
// intent's job says so, its outcome reaches the request as a notice with nothing stored in
// CHUNKS, and a follower that joins the execution after the notice went (its record finished)
// ends from the record at once instead of waiting for its idle check.
func TestNoticeOutcome(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	core := e.noticeNode(t)

	req := request("notice")
	adm := admit(t, core, req)
	job := e.take(t, req.Key)
	if !job.Notice {
		t.Fatal("the job of a non-stream intent on a notice hub does not say Notice")
	}
	rec := e.finishRecord(t, req.Key, kv.Completed, kv.Result{Status: http.StatusOK, Body: []byte(`{"answer":"notice"}`)})
	pub := jobs.NewPublisher(e.srv.JS, intent.JobOf(req.Key, rec))
	pub.SetNotice()
	if err := pub.Publish(ctx, jobs.KindResult, http.StatusOK, []byte(`{"answer":"notice"}`)); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, adm); ev.Kind != intent.Result || string(ev.Payload()) != `{"answer":"notice"}` {
		t.Fatalf("the request got %s %q, want the result by notice", ev.Kind, ev.Payload())
	}
	st, err := e.srv.JS.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("CHUNKS holds %v messages (%v), want none", info.State.Msgs, err)
	}

	// Joined after the notice: the record says the epoch ended (without the read, Next would
	// wait for ctx: nothing is stored to replay).
	fl, err := core.Follow(ctx, req.Key, rec.JobID, rec.Epoch, false)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if _, err := fl.Next(ctx); !errors.Is(err, jobs.ErrStored) {
		t.Fatalf("a follower joined after the notice: %v, want ErrStored (answer from the record)", err)
	}
}

// TestLostNoticeAnsweredFromTheRecord: a notice is a plain message, sent once. On a cluster
// one can be lost (the follower's interest had not crossed a route that was down when the
// worker published it); the outcome is in the record all the same, and the request answers
// from it after its idle check instead of waiting for a chunk that never comes.
func TestLostNoticeAnsweredFromTheRecord(t *testing.T) {
	e := newEnv(t, nil)
	core := e.noticeNode(t)

	req := request("lost-notice")
	adm := admit(t, core, req)
	if job := e.take(t, req.Key); !job.Notice {
		t.Fatal("the job of a non-stream intent on a notice hub does not say Notice")
	}
	e.finishRecord(t, req.Key, kv.Completed, kv.Result{Status: http.StatusOK, Body: []byte(`{"answer":"from the record"}`)})
	// No notice is published: the one the worker sent went nowhere.
	ev := next(t, adm)
	if ev.Kind != intent.Finished || !ev.SameEpoch || ev.View == nil || ev.View.Answer == nil || string(ev.View.Answer.Body) != `{"answer":"from the record"}` {
		t.Fatalf("the request got %s (%+v), want the outcome read from the record", ev.Kind, ev.View)
	}
}

// noticeNode is the core of an API node on e whose hub follows notices.
func (e *env) noticeNode(t *testing.T) *intent.Core {
	t.Helper()
	hub := jobs.NewHub(e.srv.NC, e.srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true, Notices: true})
	t.Cleanup(hub.Close)
	return intent.New(intent.Deps{JS: e.srv.JS, Store: e.store, Hub: hub, Log: zerolog.Nop(), Now: e.clock.Now,
		Options: intent.Options{Lease: lease, TTL: recordTTL, AutoWindow: autoWindow, ReplayCacheBytes: 1 << 20}})
}
