package intent_test

import (
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/kv"
)

// TestFinishedContinues: a delivery ends from its record only where the record continues
// exactly what the client got, in the epoch it followed (ported from httpapi's TestTail: the
// prefix check moved here, the rendering of the tail stayed there).
func TestFinishedContinues(t *testing.T) {
	events := []byte("data: a\n\ndata: b\n\ndata: c\n\n")
	usage := []byte("data: {\"usage\":1}\n\n")
	rec := func(state kv.State, epoch int, res kv.Result) *kv.Record {
		return &kv.Record{State: state, Epoch: epoch, Stream: true, API: "openai", Result: &res}
	}
	completed := kv.Result{Status: http.StatusOK, Events: events, UsageEvent: usage}
	broken := kv.Result{Status: http.StatusOK, Events: events, Partial: true, Body: []byte(`{"error":{}}`)}
	cases := []struct {
		name      string
		rec       *kv.Record
		sent      string
		usageSent bool
		want      string // the rest of the events; "-" = does not continue
	}{
		{"the rest then done", rec(kv.Completed, 2, completed), "data: a\n\n", false, "data: b\n\ndata: c\n\n"},
		{"usage already sent", rec(kv.Completed, 2, completed), string(events), true, ""},
		{"broken after output", rec(kv.Failed, 2, broken), "data: a\n\ndata: b\n\n", false, "data: c\n\n"},
		{"other bytes", rec(kv.Completed, 2, completed), "data: x\n\n", false, "-"},
		{"more than the record", rec(kv.Completed, 2, completed), string(events) + "data: d\n\n", false, "-"},
		{"another epoch", rec(kv.Completed, 3, completed), "data: a\n\n", false, "-"},
		{"a backend error answer", rec(kv.Completed, 2, kv.Result{Status: http.StatusBadRequest, Body: []byte(`{}`)}), "data: a\n\n", false, "-"},
		{"failed without output", rec(kv.Failed, 2, kv.Result{Status: http.StatusBadGateway, Body: []byte(`{}`)}), "data: a\n\n", false, "-"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := intent.FinishedFor(tc.rec, 2, []byte(tc.sent), tc.usageSent)
			if ev.Kind != intent.Finished || ev.SameEpoch != (tc.rec.Epoch == 2) || ev.UsageSent != tc.usageSent {
				t.Fatalf("event %+v, want Finished, same epoch %v", ev, tc.rec.Epoch == 2)
			}
			if ev.Continues != (tc.want != "-") || (ev.Continues && string(ev.Rest) != tc.want) {
				t.Fatalf("continues %v, rest %q; want %q", ev.Continues, ev.Rest, tc.want)
			}
		})
	}
}
