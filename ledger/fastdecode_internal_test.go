package ledger

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// storedSeeds are stored messages as the ledger writes them, from the golden export.
func storedSeeds(t testing.TB) [][]byte {
	b, err := os.ReadFile(filepath.Join("..", "testdata", "ledger", "export-clean.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, encodeStored(&e))
	}
	return out
}

func TestFastDecodeTakesWhatTheLedgerWrites(t *testing.T) {
	odd := Entry{ID: "charge.k.j.1.1", Kind: KindReversal, Tenant: "ünï <&> \"quoted\"", Reason: "line\nbreak", Model: "m",
		Epoch: -3, CostMicros: -1 << 63, Fence: 1<<64 - 1, Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
	odd.Hash = HashOf(&odd)
	seeds := append(storedSeeds(t), encodeStored(&odd))
	for i, data := range seeds {
		fast, ok := fastDecode(data)
		var slow stored
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatal(err)
		}
		if i < len(seeds)-1 && !ok {
			t.Fatalf("fast path refused a plain entry: %s", data)
		}
		if ok && fast != slow {
			t.Fatalf("fast %+v\nslow %+v", fast, slow)
		}
	}
}

// FuzzFastDecode: whenever the fast path answers, encoding/json agrees.
func FuzzFastDecode(f *testing.F) {
	for _, s := range storedSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte(`{"v":01,"id":"","kind":""}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, ok := fastDecode(data)
		if !ok {
			return
		}
		var slow stored
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatalf("fast path accepted what encoding/json refuses (%v): %q", err, data)
		}
		if fast != slow {
			t.Fatalf("fast %+v\nslow %+v\ninput %q", fast, slow, data)
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	data := storedSeeds(b)[7]
	b.Run("fast", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, ok := fastDecode(data); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var s stored
			if err := json.Unmarshal(data, &s); err != nil {
				b.Fatal(err)
			}
		}
	})
}
