package workers

import (
	"net/http"
	"testing"
	"time"

	"github.com/oncegate/oncegate/dashboard"
)

func TestFailureReason(t *testing.T) {
	cases := []struct {
		name string
		f    failure
		want string
	}{
		{"gateway error body", failure{status: 502, ambiguous: true,
			body: []byte(`{"error":{"message":"cut off: a secret prompt","type":"server_error","code":"backend_truncated"}}`)},
			"502 backend_truncated (ambiguous: may have run)"},
		{"anthropic body: its type", failure{status: 529, body: []byte(`{"type":"error","error":{"type":"overloaded_error","message":"x"}}`), refused: true},
			"529 overloaded_error (refused: never ran)"},
		{"not JSON", failure{status: http.StatusServiceUnavailable, body: []byte("<html>"), degraded: true}, "503 (degraded answer)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := failureReason(&c.f); got != c.want {
				t.Errorf("%q, want %q", got, c.want)
			}
		})
	}
}

// TestEventsNewestFirstBounded: the pool keeps its latest dashboard.MaxEvents events.
func TestEventsNewestFirstBounded(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	p := &Pool{opts: Options{ID: "w1", Now: func() time.Time { return now }}}
	for i := range dashboard.MaxEvents + 5 {
		now = now.Add(time.Second)
		p.noteEvent(dashboard.EventTakeover, string(rune('A'+i)), "t", "m", "lease")
	}
	ev := p.Events(100)
	if len(ev) != dashboard.MaxEvents || ev[0].JobID != string(rune('A'+dashboard.MaxEvents+4)) || ev[0].Node != "w1" ||
		ev[len(ev)-1].JobID != "F" {
		t.Errorf("%d events, first %+v, last %+v", len(ev), ev[0], ev[len(ev)-1])
	}
	if got := p.Events(3); len(got) != 3 || got[0] != ev[0] {
		t.Errorf("Events(3) = %+v", got)
	}
}
