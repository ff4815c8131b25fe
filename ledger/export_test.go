package ledger_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/ledger"
)

const goldenDir = "../testdata/ledger"

// tamperings derive the tampered golden exports from the clean one, with where Verify must
// find the break and what it must say.
var tamperings = []struct {
	name   string
	tamper func([]ledger.Entry) []ledger.Entry
	index  int
	reason string
}{
	{"altered", func(es []ledger.Entry) []ledger.Entry {
		es[1].CostMicros-- // globex's first charge, one micro cheaper
		return es
	}, 1, "hash mismatch"},
	{"removed", func(es []ledger.Entry) []ledger.Entry {
		return append(es[:3:3], es[4:]...) // acme's completed charge of k3
	}, 3, "prev_hash"},
	{"swapped", func(es []ledger.Entry) []ledger.Entry {
		es[2], es[3] = es[3], es[2] // two entries of acme's chain
		return es
	}, 2, "prev_hash"},
	{"swapped-tenants", func(es []ledger.Entry) []ledger.Entry {
		es[1], es[2] = es[2], es[1] // globex's and acme's: each chain still links, the stream order does not
		return es
	}, 2, "sequence"},
}

func goldenPath(name, format string) string {
	return filepath.Join(goldenDir, "export-"+name+"."+format)
}

// TestGoldenExports: the golden scenario run through a real ledger exports byte for byte the
// committed files (so the canonical encoding and hash never drift), the clean export verifies
// in both formats and each tampered one fails where it was tampered.
func TestGoldenExports(t *testing.T) {
	srv := start(t)
	clean := buildGolden(t, srv.JS)
	if len(clean) != 9 {
		t.Fatalf("golden scenario produced %d entries, want 9", len(clean))
	}
	variants := map[string][]ledger.Entry{"clean": clean}
	for _, tm := range tamperings {
		variants[tm.name] = tm.tamper(append([]ledger.Entry(nil), clean...))
	}
	for name, es := range variants {
		for _, format := range []string{ledger.FormatJSONL, ledger.FormatCSV} {
			var buf bytes.Buffer
			if err := ledger.WriteExport(&buf, format, es); err != nil {
				t.Fatal(err)
			}
			path := goldenPath(name, format)
			testkit.Golden(t, path, buf.Bytes())
		}
	}
}

func TestVerifyGolden(t *testing.T) {
	for _, format := range []string{ledger.FormatJSONL, ledger.FormatCSV} {
		t.Run("clean."+format, func(t *testing.T) {
			es := readGolden(t, "clean", format)
			if err := ledger.Verify(es); err != nil {
				t.Fatalf("clean export: %v", err)
			}
		})
		for _, tm := range tamperings {
			t.Run(tm.name+"."+format, func(t *testing.T) {
				err := ledger.Verify(readGolden(t, tm.name, format))
				var ce *ledger.ChainError
				if !errors.Is(err, ledger.ErrChainBroken) || !errors.As(err, &ce) {
					t.Fatalf("Verify: %v, want a ChainError", err)
				}
				if ce.Index != tm.index || !strings.Contains(ce.Reason, tm.reason) {
					t.Fatalf("Verify: %v; want the break at entry %d, reason mentioning %q", err, tm.index, tm.reason)
				}
			})
		}
	}
}

func readGolden(t *testing.T, name, format string) []ledger.Entry {
	t.Helper()
	f, err := os.Open(goldenPath(name, format))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	es, err := ledger.ReadExport(f, format)
	if err != nil {
		t.Fatal(err)
	}
	return es
}

func TestExportRoundTrip(t *testing.T) {
	es := readGolden(t, "clean", ledger.FormatJSONL)
	for _, format := range []string{ledger.FormatJSONL, ledger.FormatCSV} {
		var buf bytes.Buffer
		if err := ledger.WriteExport(&buf, format, es); err != nil {
			t.Fatal(err)
		}
		back, err := ledger.ReadExport(&buf, format)
		if err != nil {
			t.Fatal(err)
		}
		if len(back) != len(es) {
			t.Fatalf("%s: %d entries back, want %d", format, len(back), len(es))
		}
		for i := range es {
			if !back[i].Time.Equal(es[i].Time) {
				t.Fatalf("%s entry %d: time %v, want %v", format, i, back[i].Time, es[i].Time)
			}
			back[i].Time = es[i].Time
			if back[i] != es[i] {
				t.Fatalf("%s entry %d: %+v, want %+v", format, i, back[i], es[i])
			}
		}
	}
}

func TestReadExportRejects(t *testing.T) {
	clean, err := os.ReadFile(goldenPath("clean", ledger.FormatCSV))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, format, data string
		want               error
	}{
		{"unknown format", "xml", "", ledger.ErrInvalid},
		{"unknown json field", ledger.FormatJSONL, `{"id":"x","surprise":1}`, ledger.ErrCorrupt},
		{"not json", ledger.FormatJSONL, `{"id":`, ledger.ErrCorrupt},
		{"two objects on a line", ledger.FormatJSONL, `{"id":"a"} {"id":"b"}`, ledger.ErrCorrupt},
		{"bad csv header", ledger.FormatCSV, "a,b,c\n", ledger.ErrCorrupt},
		{"bad csv number", ledger.FormatCSV, strings.Replace(string(clean), ",1200,350,", ",12x0,350,", 1), ledger.ErrCorrupt},
		{"short csv row", ledger.FormatCSV, strings.SplitAfter(string(clean), "\n")[0] + "1,2,3\n", ledger.ErrCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := ledger.ReadExport(strings.NewReader(tt.data), tt.format); !errors.Is(err, tt.want) {
				t.Fatalf("ReadExport: %v, want %v", err, tt.want)
			}
		})
	}
}

func FuzzReadExport(f *testing.F) {
	for _, format := range []string{ledger.FormatJSONL, ledger.FormatCSV} {
		for _, name := range []string{"clean", "altered"} {
			b, err := os.ReadFile(goldenPath(name, format))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b, format == ledger.FormatCSV)
		}
	}
	f.Add([]byte(`{"time":"0000-01-01T00:00:00Z","seq":18446744073709551615}`), false)
	f.Add([]byte("\"unterminated\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, csv bool) {
		format := ledger.FormatJSONL
		if csv {
			format = ledger.FormatCSV
		}
		es, err := ledger.ReadExport(bytes.NewReader(data), format)
		if err != nil {
			if !errors.Is(err, ledger.ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		_ = ledger.Verify(es) // never panics either
		_, _, _ = ledger.PlanReconcile(es)
		var buf bytes.Buffer
		_ = ledger.WriteExport(&buf, format, es)
	})
}
