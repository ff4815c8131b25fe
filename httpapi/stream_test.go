package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/intent"
)

// TestTail: a live stream ends from its record only where the record continues exactly what
// the client got, in the epoch it followed. The prefix check is intent's (TestFinishedContinues
// there); finished models it here, on the same cases.
func TestTail(t *testing.T) {
	events := []byte("data: a\n\ndata: b\n\ndata: c\n\n")
	usage := []byte("data: {\"usage\":1}\n\n")
	rec := func(state intent.State, epoch int, a intent.Answer) *intent.View {
		a.Failed = state == intent.Failed
		return &intent.View{State: state, Epoch: epoch, Stream: true, API: "openai", Answer: &a}
	}
	completed := intent.Answer{Status: http.StatusOK, Events: events, UsageEvent: usage}
	broken := intent.Answer{Status: http.StatusOK, Events: events, Partial: true, Body: []byte(`{"error":{}}`)}
	// finished is the event a delivery that followed epoch 2 and sent sent gets from v.
	finished := func(v *intent.View, sent string, usageSent bool) intent.Event {
		ev := intent.Event{Kind: intent.Finished, View: v, SameEpoch: v.Epoch == 2, UsageSent: usageSent, Sent: true}
		if !v.Running() && ev.SameEpoch && v.Stream && strings.HasPrefix(string(v.Answer.Events), sent) {
			ev.Continues, ev.Rest = true, v.Answer.Events[len(sent):]
		}
		return ev
	}
	cases := []struct {
		name         string
		rec          *intent.View
		sent         string
		usageSent    bool
		includeUsage bool
		want         string // "" = not ok
	}{
		{"the rest then done", rec(intent.Completed, 2, completed), "data: a\n\n", false, false, "data: b\n\ndata: c\n\ndata: [DONE]\n\n"},
		{"usage when asked", rec(intent.Completed, 2, completed), "data: a\n\n", false, true, "data: b\n\ndata: c\n\n" + string(usage) + "data: [DONE]\n\n"},
		{"usage already sent", rec(intent.Completed, 2, completed), string(events), true, true, "data: [DONE]\n\n"},
		{"broken after output", rec(intent.Failed, 2, broken), "data: a\n\ndata: b\n\n", false, false, "data: c\n\ndata: {\"error\":{}}\n\n"},
		{"other bytes", rec(intent.Completed, 2, completed), "data: x\n\n", false, false, ""},
		{"more than the record", rec(intent.Completed, 2, completed), string(events) + "data: d\n\n", false, false, ""},
		{"another epoch", rec(intent.Completed, 3, completed), "data: a\n\n", false, false, ""},
		{"still running", rec(intent.Running, 2, completed), "data: a\n\n", false, false, ""},
		{"a backend error answer", rec(intent.Completed, 2, intent.Answer{Status: http.StatusBadRequest, Body: []byte(`{}`)}), "data: a\n\n", false, false, ""},
		{"failed without output", rec(intent.Failed, 2, intent.Answer{Status: http.StatusBadGateway, Body: []byte(`{}`)}), "data: a\n\n", false, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := wireOf("openai").tail(finished(tc.rec, tc.sent, tc.usageSent), tc.includeUsage)
			if ok != (tc.want != "") || string(got) != tc.want {
				t.Fatalf("tail = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}
