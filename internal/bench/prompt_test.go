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
		got := padPrompt(tc.text, Words(tc.n, 1), tc.n)
		if want := max(len(tc.text), tc.n); len(got) != want || !strings.HasPrefix(got, tc.text) {
			t.Errorf("padPrompt(%q, %d): %d bytes %q..., want %d bytes starting with the text", tc.text, tc.n, len(got), got[:min(len(got), 20)], want)
		}
	}
}

func TestWords(t *testing.T) {
	for _, n := range []int{-1, 0, 1, 2, 100, 1 << 20} {
		got := Words(n, 7)
		if len(got) != max(n, 0) {
			t.Fatalf("Words(%d): %d bytes", n, len(got))
		}
		if strings.Trim(got, "abcdefghijklmnopqrstuvwxyz. ") != "" {
			t.Fatalf("Words(%d) holds more than lower-case words, spaces and full stops", n)
		}
	}
	if Words(4096, 1) != Words(4096, 1) || Words(4096, 1) == Words(4096, 2) {
		t.Fatal("Words is not a function of its seed")
	}
	// Zipf draws: the text repeats words but is not one repeated phrase.
	words := strings.Fields(Words(64<<10, 3))
	seen := map[string]int{}
	for _, w := range words {
		seen[strings.TrimSuffix(w, ".")]++
	}
	if len(seen) < 500 || len(seen) > len(words)/2 {
		t.Fatalf("%d distinct words in %d: want a vocabulary with repeats", len(seen), len(words))
	}
}
