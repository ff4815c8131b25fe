package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a testing.TB that records failures instead of failing the real test, so a
// helper's failure path can be checked. Fatal* end the calling goroutine, as testing's do:
// run the helper with recorder.run.
type recorder struct {
	testing.TB
	mu       sync.Mutex
	errors   []string
	fatal    bool
	finished bool
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	r.mu.Lock()
	r.fatal = true
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

// run calls fn(r) on a goroutine of its own (Fatalf ends it) and waits for it.
func (r *recorder) run(fn func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
		r.mu.Lock()
		r.finished = true
		r.mu.Unlock()
	}()
	<-done
}

func TestCheckFor(t *testing.T) {
	t.Run("returns once fn succeeds", func(t *testing.T) {
		r := &recorder{TB: t}
		calls := 0
		r.run(func(tb testing.TB) {
			CheckFor(tb, time.Minute, time.Millisecond, func() error {
				calls++
				if calls < 3 {
					return fmt.Errorf("call %d: not yet", calls)
				}
				return nil
			})
		})
		if !r.finished || len(r.errors) > 0 {
			t.Fatalf("finished=%v errors=%q, want a return without failure", r.finished, r.errors)
		}
		if calls != 3 {
			t.Errorf("fn called %d times, want 3 (until its first success, then no more)", calls)
		}
	})
	t.Run("fails with fn's last error on timeout", func(t *testing.T) {
		r := &recorder{TB: t}
		calls := 0
		r.run(func(tb testing.TB) {
			CheckFor(tb, 20*time.Millisecond, time.Millisecond, func() error {
				calls++
				return fmt.Errorf("still wrong after call %d", calls)
			})
		})
		if r.finished || !r.fatal || len(r.errors) != 1 {
			t.Fatalf("finished=%v fatal=%v errors=%q, want one fatal failure", r.finished, r.fatal, r.errors)
		}
		if want := fmt.Sprintf("still wrong after call %d", calls); !strings.Contains(r.errors[0], want) {
			t.Errorf("failure %q does not carry fn's last error %q", r.errors[0], want)
		}
	})
}

func TestGolden(t *testing.T) {
	path := filepath.Join(t.TempDir(), "testdata", "out.golden")

	// -update writes the file (and its directory).
	*update = true
	r := &recorder{TB: t}
	r.run(func(tb testing.TB) { Golden(tb, path, []byte("hello golden\n")) })
	*update = false
	if len(r.errors) > 0 {
		t.Fatalf("Golden with -update failed: %q", r.errors)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "hello golden\n" {
		t.Fatalf("golden file = %q, %v; want what was written", b, err)
	}

	for _, tc := range []struct {
		name    string
		path    string
		got     string
		wantErr string // "" = no failure
	}{
		{"equal", path, "hello golden\n", ""},
		{"differ", path, "hello silver\n", "differs from " + path + " at byte 6"},
		{"shorter", path, "hello", "at byte 5"},
		{"missing file", path + ".none", "x", "run with -update to create it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			r.run(func(tb testing.TB) { Golden(tb, tc.path, []byte(tc.got)) })
			switch {
			case tc.wantErr == "" && len(r.errors) > 0:
				t.Errorf("unexpected failure: %q", r.errors)
			case tc.wantErr != "" && (len(r.errors) != 1 || !strings.Contains(r.errors[0], tc.wantErr)):
				t.Errorf("failures %q, want one containing %q", r.errors, tc.wantErr)
			}
		})
	}
	if b, _ := os.ReadFile(path); string(b) != "hello golden\n" {
		t.Errorf("a compare without -update changed the golden file to %q", b)
	}
}
