package anthropic

import (
	"encoding/json"
	"testing"
)

// TestDropResent: the whitespace an Anthropic prefill was sent without is not sent to the
// clients a second time when the continuation generates it again; anything else is new text.
func TestDropResent(t *testing.T) {
	tests := []struct {
		name, resend string
		deltas       []string
		want         string // what the clients get of the continuation
	}{
		{"nothing trimmed", "", []string{" next", " word"}, " next word"},
		{"space generated again", " ", []string{" next", " word"}, "next word"},
		{"space generated alone", " ", []string{" ", "next"}, "next"},
		{"newlines across deltas", "\n\n", []string{"\n", "\nnext"}, "next"},
		{"model chose other text", " ", []string{"next", " word"}, "next word"},
		{"only part of it again", " \n", []string{" next"}, "next"},
		{"letters are never dropped", "", []string{"t the"}, "t the"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Stream{resend: tt.resend}
			got := ""
			for _, d := range tt.deltas {
				data, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": d}})
				if r.resend == "" {
					got += d
					continue
				}
				out, text, keep := r.dropResent(data, 0, d)
				if !keep {
					continue
				}
				var e event
				if err := json.Unmarshal(out, &e); err != nil || e.Delta.Text != text {
					t.Fatalf("rewritten event %s (err %v) does not carry %q", out, err, text)
				}
				got += text
			}
			if got != tt.want {
				t.Errorf("clients get %q, want %q", got, tt.want)
			}
		})
	}
}
