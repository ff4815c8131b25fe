package testkit

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

// update is the one -update flag of every package whose tests compare with golden files:
// `go test ./pkg -update` rewrites them from what the code produces now.
var update = flag.Bool("update", false, "rewrite golden files under testdata/ with the output of this run")

// Golden compares got with the file at path (relative to the test's package), or writes it
// when the test runs with -update. A mismatch fails the test and names the first differing
// byte.
func Golden(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("testkit: golden file %s: %v (run with -update to create it)", path, err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Errorf("testkit: output differs from %s at byte %d (got %d bytes, want %d; -update rewrites it)\ngot:  %q\nwant: %q",
			path, i, len(got), len(want), snippet(got, i), snippet(want, i))
	}
}

func snippet(b []byte, at int) []byte {
	lo, hi := max(0, at-40), min(len(b), at+40)
	return b[lo:hi]
}
