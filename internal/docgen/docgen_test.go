package docgen

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestConfigReference fails when docs/configuration.md is not what the generator writes from
// the configuration as it is now (a field added, renamed, its default or its doc changed), or
// when a field has no doc comment. `go test ./internal/docgen -update` rewrites the page.
func TestConfigReference(t *testing.T) {
	got, err := Reference(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, filepath.Join("..", "..", "docs", "configuration.md"), got)
}

// TestUndocumentedFields shows the doc rule on small sources: a field is documented by a
// comment above it, at the end of its line, or (a nested section) by its type's doc; any
// other field is named in an error matching ErrUndocumented.
func TestUndocumentedFields(t *testing.T) {
	cases := []struct {
		name    string
		src     string
		missing []string // paths the error must name; nil: no error
	}{
		{"all documented", `
// Config is it.
type Config struct {
	// A is documented above.
	A string ` + "`yaml:\"a\"`" + `
	B int ` + "`yaml:\"b\"`" + ` // B at the end of its line
	Sub Sub ` + "`yaml:\"sub\"`" + `
	Hidden string // no yaml tag: not a key
}

// Sub documents the field that holds it.
type Sub struct {
	C []string ` + "`yaml:\"c\"`" + ` // c
}`, nil},
		{"a field without a comment", `
type Config struct {
	A string ` + "`yaml:\"a\"`" + ` // a
	B int ` + "`yaml:\"b\"`" + `
}`, []string{"b"}},
		{"a section whose type has no doc, and its field", `
type Config struct {
	Subs []Sub ` + "`yaml:\"subs\"`" + `
}

type Sub struct {
	C string ` + "`yaml:\"c\"`" + `
}`, []string{"subs", "subs[].c"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "c.go"), []byte("package c\n"+tc.src+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			secs, err := Sections(dir, "Config")
			if tc.missing == nil {
				if err != nil {
					t.Fatalf("Sections: %v", err)
				}
				if len(secs) != 2 || len(secs[0].Fields) != 3 || secs[1].Path != "sub" || secs[1].Fields[0].Path != "sub.c" {
					t.Errorf("sections %+v: want the top level (a, b, sub) and sub (sub.c)", secs)
				}
				return
			}
			if !errors.Is(err, ErrUndocumented) {
				t.Fatalf("Sections: %v, want ErrUndocumented", err)
			}
			_, list, _ := strings.Cut(err.Error(), ": ")
			_, list, _ = strings.Cut(list, ": ")
			if got := strings.Split(list, ", "); strings.Join(got, ",") != strings.Join(tc.missing, ",") {
				t.Errorf("undocumented %q, want %q", got, tc.missing)
			}
		})
	}
}

// TestEveryEnvVarSetsAKey: each environment variable the configuration names changes some
// key of a default configuration (alone, or with its partner), so the reference can say which.
func TestEveryEnvVarSetsAKey(t *testing.T) {
	src, err := parse(filepath.Join("..", "config"))
	if err != nil {
		t.Fatal(err)
	}
	if len(src.consts) == 0 {
		t.Fatal("no Env* constants found in internal/config")
	}
	for _, e := range probeEnv(src.consts) {
		if len(e.sets) == 0 {
			t.Errorf("%s (%s) changes no key of a default configuration", e.value, e.name)
		}
	}
}
