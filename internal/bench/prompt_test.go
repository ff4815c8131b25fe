package bench

import (
	"strings"
	"testing"
)

func TestPadPrompt(t *testing.T) {
	for _, tc := range []struct {
		text string
		n    int
	}{
		{"hello", 0}, {"hello", 5}, {"hello", 6}, {"hello", 50}, {"hello", 4096}, {"", 3},
	} {
		got := padPrompt(tc.text, tc.n)
		if want := max(len(tc.text), tc.n); len(got) != want || !strings.HasPrefix(got, tc.text) {
			t.Errorf("padPrompt(%q, %d): %d bytes %q..., want %d bytes starting with the text", tc.text, tc.n, len(got), got[:min(len(got), 20)], want)
		}
	}
}
