package kv_test

import (
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/oncegate/oncegate/kv"
)

// TestTransitions: every row of the state table (kv/record.go), from a PENDING record with
// every field set: the record a transition returns is the receiver with exactly the fields
// the row names changed (a deep compare, so a field set or dropped by mistake fails), and the
// receiver is as it was, its Unfinished not aliased by the result's.
func TestTransitions(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 30, 0, time.UTC)
	const lease = 15 * time.Second
	pending := func() *kv.Record {
		unfinished := make([]kv.Unfinished, 1, 4) // spare capacity: an append in place would show
		unfinished[0] = kv.Unfinished{Epoch: 1, Attempts: 1, Backend: "a", RequestBytes: 8}
		return &kv.Record{
			State: kv.Pending, Tenant: "t", JobID: "J", Epoch: 2, Fingerprint: "fp", Owner: "o", Auto: true,
			Created: now.Add(-time.Minute), EpochStarted: now.Add(-30 * time.Second), LeaseUntil: now.Add(-time.Second),
			Worker: "w1", Progress: kv.ProgressDispatched, Chunks: 3, Tokens: 7, Attempts: 1, Takeovers: 1,
			Unfinished: unfinished, Model: "m", API: "openai", Backends: []string{"a", "b"}, Backend: "b",
			Degraded: &kv.Degraded{Message: "busy"}, Stream: true, Request: []byte("12345678"),
			Header: map[string][]string{"X-A": {"1"}}, Deadline: now.Add(time.Hour),
		}
	}
	queued := func(r *kv.Record) { r.Progress, r.Chunks, r.Tokens = kv.ProgressQueued, 0, 0 }
	// What the execution in these rows did, and the outcome it stores.
	done := kv.Execution{Worker: "w2", Backend: "a", Attempts: 2, Ambiguous: 1, Degraded: true, Chunks: 5, Tokens: 11}
	answer := &kv.Result{Status: http.StatusOK, Body: []byte(`{"ok":1}`), Usage: &kv.Usage{TotalTokens: 3}}
	answerBefore := *answer
	broken := &kv.Result{Status: http.StatusOK, Events: []byte("data: x\n\n"), Partial: true}
	gaveUp := &kv.Result{Status: http.StatusBadGateway, Body: []byte("e"), Retryable: true}
	cancelBody := []byte(`{"error":{}}`)
	sent := func(epoch int) *kv.Progress {
		return &kv.Progress{JobID: "J", Epoch: epoch, Attempt: 2, Backend: "b", Sent: now.Add(-5 * time.Second), Tokens: 4}
	}
	// finished is what Completed and Failed both set.
	finished := func(state kv.State, res *kv.Result) func(r *kv.Record) {
		return func(r *kv.Record) {
			stored := *res
			stored.Finished, stored.Backend, stored.Attempts, stored.Degraded, stored.Ambiguous = now, "a", 2, true, 1
			r.State, r.Result, r.Request, r.RequestBytes = state, &stored, nil, 8
			r.Progress, r.Chunks, r.Tokens, r.LeaseUntil = kv.ProgressFinished, 5, 11, time.Time{}
			r.Worker, r.Attempts, r.Backend = "w2", 3, "a"
		}
	}
	// takenOver is what every takeover sets, besides what it adds to Unfinished.
	takenOver := func(r *kv.Record) {
		r.Epoch, r.EpochStarted, r.LeaseUntil, r.Takeovers = 3, now, now.Add(lease), 2
		r.Worker, r.Progress, r.Chunks = "", kv.ProgressQueued, 0
	}
	// takenOverCounting is a takeover that also keeps u, the vanished epoch's attempts.
	takenOverCounting := func(u kv.Unfinished) func(r *kv.Record) {
		return func(r *kv.Record) {
			takenOver(r)
			r.Unfinished = append(r.Unfinished, u)
			r.Attempts += u.Attempts
		}
	}
	// certain is the one attempt a dispatched record without progress certainly sent.
	certain := kv.Unfinished{Epoch: 2, Attempts: 1, Backend: "b", Tokens: 7, RequestBytes: 8}
	cancelled := func(r *kv.Record) {
		r.RequestBytes, r.State, r.Cancelled, r.Request, r.Progress = 8, kv.Failed, true, nil, kv.ProgressFinished
		r.Result = &kv.Result{Status: http.StatusConflict, Body: cancelBody, Finished: now}
	}
	for _, tc := range []struct {
		name string
		from func(r *kv.Record) // how this row's record differs from pending()
		to   func(r *kv.Record) *kv.Record
		want func(r *kv.Record) // the changes the transition makes
	}{
		{
			name: "dispatched",
			from: queued,
			to:   func(r *kv.Record) *kv.Record { return r.Dispatched() },
			want: func(r *kv.Record) { r.Progress = kv.ProgressDispatched },
		},
		{
			name: "renewed before any chunk: only the lease and the worker",
			to:   func(r *kv.Record) *kv.Record { return r.Renewed(now, lease, "w2", 0, 9) },
			want: func(r *kv.Record) { r.LeaseUntil, r.Worker = now.Add(lease), "w2" },
		},
		{
			name: "renewed while streaming",
			to:   func(r *kv.Record) *kv.Record { return r.Renewed(now, lease, "w2", 4, 9) },
			want: func(r *kv.Record) {
				r.LeaseUntil, r.Worker = now.Add(lease), "w2"
				r.Progress, r.Chunks, r.Tokens = kv.ProgressStreaming, 4, 9
			},
		},
		{
			name: "completed",
			to:   func(r *kv.Record) *kv.Record { return r.Completed(now, answer, done) },
			want: finished(kv.Completed, answer),
		},
		{
			name: "failed, retryable",
			to:   func(r *kv.Record) *kv.Record { return r.Failed(now, gaveUp, done) },
			want: finished(kv.Failed, gaveUp),
		},
		{
			name: "failed after output",
			to:   func(r *kv.Record) *kv.Record { return r.Failed(now, broken, done) },
			want: finished(kv.Failed, broken),
		},
		{
			name: "taken over: the epoch's progress says what was sent",
			to:   func(r *kv.Record) *kv.Record { return r.TakenOver(now, lease, sent(2)) },
			want: takenOverCounting(kv.Unfinished{Epoch: 2, Attempts: 2, Backend: "b", Tokens: 4, RequestBytes: 8}),
		},
		{
			name: "taken over without progress, dispatched: one attempt certainly sent",
			to:   func(r *kv.Record) *kv.Record { return r.TakenOver(now, lease, nil) },
			want: takenOverCounting(certain),
		},
		{
			name: "taken over, another epoch's progress ignored, dispatched",
			to:   func(r *kv.Record) *kv.Record { return r.TakenOver(now, lease, sent(1)) },
			want: takenOverCounting(certain),
		},
		{
			name: "taken over without progress, queued: nothing known sent",
			from: queued,
			to:   func(r *kv.Record) *kv.Record { return r.TakenOver(now, lease, nil) },
			want: takenOver,
		},
		{
			name: "taken over, another job's progress ignored, queued",
			from: queued,
			to: func(r *kv.Record) *kv.Record {
				p := sent(2)
				p.JobID = "K"
				return r.TakenOver(now, lease, p)
			},
			want: takenOver,
		},
		{
			name: "taken over, progress with nothing sent",
			to: func(r *kv.Record) *kv.Record {
				p := sent(2)
				p.Attempt = 0
				return r.TakenOver(now, lease, p)
			},
			want: takenOver,
		},
		{
			name: "taken over, the epoch already unfinished: not counted twice",
			from: func(r *kv.Record) { r.Unfinished[0].Epoch = 2 },
			to:   func(r *kv.Record) *kv.Record { return r.TakenOver(now, lease, sent(2)) },
			want: takenOver,
		},
		{
			name: "cancelled while an attempt runs",
			to:   func(r *kv.Record) *kv.Record { return r.CancelledAt(now, cancelBody, sent(2)) },
			want: func(r *kv.Record) {
				cancelled(r)
				r.Unfinished = append(r.Unfinished, kv.Unfinished{Epoch: 2, Attempts: 2, Backend: "b", Tokens: 4, RequestBytes: 8, Cancelled: true})
				r.Attempts = 3
			},
		},
		{
			name: "cancelled, another epoch's progress ignored",
			to:   func(r *kv.Record) *kv.Record { return r.CancelledAt(now, cancelBody, sent(1)) },
			want: cancelled,
		},
		{
			// Before any renewal the record knows nothing of the stream: the progress tells
			// what it streamed (issue 34: a cancelled job read 0 tokens though it streamed).
			name: "cancelled while an attempt runs, before its first renewal",
			from: queued,
			to:   func(r *kv.Record) *kv.Record { return r.CancelledAt(now, cancelBody, sent(2)) },
			want: func(r *kv.Record) {
				cancelled(r)
				r.Unfinished = append(r.Unfinished, kv.Unfinished{Epoch: 2, Attempts: 2, Backend: "b", Tokens: 4, RequestBytes: 8, Cancelled: true})
				r.Attempts, r.Tokens = 3, 4
			},
		},
		{
			name: "cancelled while queued",
			from: queued,
			to:   func(r *kv.Record) *kv.Record { return r.CancelledAt(now, cancelBody, nil) },
			want: cancelled,
		},
		{
			name: "released",
			to:   func(r *kv.Record) *kv.Record { return r.Released() },
			want: func(r *kv.Record) {
				r.State, r.Request = kv.Failed, nil
				r.Result = &kv.Result{Status: http.StatusServiceUnavailable, Retryable: true}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := pending()
			if tc.from != nil {
				tc.from(rec)
			}
			before := deepCopy(rec)
			backing := slices.Clone(rec.Unfinished[:cap(rec.Unfinished)])
			want := deepCopy(rec)
			tc.want(want)

			got := tc.to(rec)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			if !reflect.DeepEqual(rec, before) {
				t.Errorf("the receiver changed:\nnow    %+v\nbefore %+v", rec, before)
			}
			if !slices.Equal(rec.Unfinished[:cap(rec.Unfinished)], backing) {
				t.Error("the transition wrote into the receiver's Unfinished array")
			}
			if len(got.Unfinished) > 0 && &got.Unfinished[0] == &rec.Unfinished[0] {
				t.Error("the result's Unfinished aliases the receiver's")
			}
			if !reflect.DeepEqual(*answer, answerBefore) {
				t.Error("the transition changed the caller's result")
			}
		})
	}
}

// deepCopy is r with its own copy of every field a transition could write through.
func deepCopy(r *kv.Record) *kv.Record {
	c := *r
	c.Unfinished = slices.Clone(r.Unfinished)
	c.Request = slices.Clone(r.Request)
	if r.Result != nil {
		res := *r.Result
		c.Result = &res
	}
	return &c
}
