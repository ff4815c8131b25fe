package httpapi

import (
	"net/http"
	"testing"

	"github.com/oncegate/oncegate/kv"
)

// TestTail: a live stream ends from its record only where the record continues exactly what
// the client got, in the epoch it followed.
func TestTail(t *testing.T) {
	events := []byte("data: a\n\ndata: b\n\ndata: c\n\n")
	usage := []byte("data: {\"usage\":1}\n\n")
	rec := func(state kv.State, epoch int, res kv.Result) *kv.Record {
		return &kv.Record{State: state, Epoch: epoch, Stream: true, API: "openai", Result: &res}
	}
	completed := kv.Result{Status: http.StatusOK, Events: events, UsageEvent: usage}
	broken := kv.Result{Status: http.StatusOK, Events: events, Partial: true, Body: []byte(`{"error":{}}`)}
	cases := []struct {
		name         string
		rec          *kv.Record
		sent         string
		usageSent    bool
		includeUsage bool
		want         string // "" = not ok
	}{
		{"the rest then done", rec(kv.Completed, 2, completed), "data: a\n\n", false, false, "data: b\n\ndata: c\n\ndata: [DONE]\n\n"},
		{"usage when asked", rec(kv.Completed, 2, completed), "data: a\n\n", false, true, "data: b\n\ndata: c\n\n" + string(usage) + "data: [DONE]\n\n"},
		{"usage already sent", rec(kv.Completed, 2, completed), string(events), true, true, "data: [DONE]\n\n"},
		{"broken after output", rec(kv.Failed, 2, broken), "data: a\n\ndata: b\n\n", false, false, "data: c\n\ndata: {\"error\":{}}\n\n"},
		{"other bytes", rec(kv.Completed, 2, completed), "data: x\n\n", false, false, ""},
		{"more than the record", rec(kv.Completed, 2, completed), string(events) + "data: d\n\n", false, false, ""},
		{"another epoch", rec(kv.Completed, 3, completed), "data: a\n\n", false, false, ""},
		{"still running", rec(kv.Pending, 2, completed), "data: a\n\n", false, false, ""},
		{"a backend error answer", rec(kv.Completed, 2, kv.Result{Status: http.StatusBadRequest, Body: []byte(`{}`)}), "data: a\n\n", false, false, ""},
		{"failed without output", rec(kv.Failed, 2, kv.Result{Status: http.StatusBadGateway, Body: []byte(`{}`)}), "data: a\n\n", false, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var sent liveSent
			sent.data([]byte(tc.sent))
			sent.usage = tc.usageSent
			got, ok := wireOf("openai").tail(tc.rec, 2, &sent, tc.includeUsage)
			if ok != (tc.want != "") || string(got) != tc.want {
				t.Fatalf("tail = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}
