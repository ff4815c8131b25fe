package bench

import (
	"math/rand/v2"
	"strings"
)

// Words returns n bytes of text that stands in for a long prompt: words drawn with Zipf
// frequencies (s = 1.1, as in natural language) from a vocabulary of 4,096 made-up words of 2-9
// letters, a full stop every twelve words, all from seed (the same seed, the same text).
//
// A long prompt padded with one sentence repeated would measure nothing a compressor or a
// deduplicating store does: S2 stores such padding in a few hundred bytes per MiB, and this
// text at about half its size (2.0×), close to what it does with English prose (1.6× for
// this repository's README).
func Words(n int, seed uint64) string {
	if n <= 0 {
		return ""
	}
	r := rand.New(rand.NewPCG(seed, 0x6f6e6365676174)) // #nosec G404 -- filler text, the same for a seed by design; nothing secret ("oncegat")
	vocab := make([]string, 4096)
	for i := range vocab {
		w := make([]byte, 2+r.IntN(8))
		for j := range w {
			w[j] = byte('a' + r.IntN(26))
		}
		vocab[i] = string(w)
	}
	zipf := rand.NewZipf(r, 1.1, 1, uint64(len(vocab)-1))
	var b strings.Builder
	b.Grow(n + 16)
	for i := 1; b.Len() < n; i++ {
		b.WriteString(vocab[zipf.Uint64()])
		if i%12 == 0 {
			b.WriteString(". ")
		} else {
			b.WriteByte(' ')
		}
	}
	return b.String()[:n]
}
