package partition

import (
	"errors"
	"fmt"
	"testing"
)

func TestNames(t *testing.T) {
	tests := []struct {
		p            P
		stream, subj string
		tag, tagged  string
	}{
		{0, "JOBS", "jobs.run.", "og-p0", "abc"},
		{1, "JOBS_P1", "p1.jobs.run.", "og-p1", "p1-abc"},
		{12, "JOBS_P12", "p12.jobs.run.", "og-p12", "p12-abc"},
	}
	for _, tt := range tests {
		if got := tt.p.Stream("JOBS"); got != tt.stream {
			t.Errorf("P(%d).Stream = %q, want %q", tt.p, got, tt.stream)
		}
		if got := tt.p.Subject("jobs.run."); got != tt.subj {
			t.Errorf("P(%d).Subject = %q, want %q", tt.p, got, tt.subj)
		}
		if got := tt.p.Tag(); got != tt.tag {
			t.Errorf("P(%d).Tag = %q, want %q", tt.p, got, tt.tag)
		}
		if got := tt.p.Tagged("abc"); got != tt.tagged {
			t.Errorf("P(%d).Tagged = %q, want %q", tt.p, got, tt.tagged)
		}
	}
}

func TestKeyRoundTrip(t *testing.T) {
	for _, count := range []int{1, 2, 3, 7, Max} {
		seen := make([]int, count)
		for i := range 2000 {
			hex := fmt.Sprintf("%032x", i*7919)
			key := Key(count, hex)
			p := OfKey(key)
			if int(p) >= count {
				t.Fatalf("count %d: key %q in partition %d", count, key, p)
			}
			if Key(count, hex) != key {
				t.Fatalf("count %d: Key is not stable for %q", count, hex)
			}
			if Untagged(key) != hex {
				t.Fatalf("count %d: Untagged(%q) = %q", count, key, Untagged(key))
			}
			seen[p]++
		}
		for p, n := range seen {
			// 2000 keys over count partitions: each gets a share (a hash, not a round robin).
			if n == 0 {
				t.Errorf("count %d: partition %d got no key of 2000", count, p)
			}
		}
		if count == 1 && seen[0] != 2000 {
			t.Errorf("one partition: %d keys in it", seen[0])
		}
	}
}

func TestOfKeyPlainKeys(t *testing.T) {
	for _, key := range []string{"", "p", "p-", "p1", "0123456789abcdef0123456789abcdef", "job.01ARZ3NDEKTSV4RRFFQ69G5FAV", "px-1", "p99-abc", "p0-abc"} {
		if p := OfKey(key); p != 0 {
			t.Errorf("OfKey(%q) = %d, want 0", key, p)
		}
	}
	if p := OfKey("p3-abc"); p != 3 {
		t.Errorf("OfKey(p3-abc) = %d", p)
	}
}

func TestIDs(t *testing.T) {
	const id = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
	if got := ID(1, id, 0); got != id {
		t.Errorf("one partition changed the id: %q", got)
	}
	if p, ok := OfID(1, id); !ok || p != 0 {
		t.Errorf("OfID(1) = %d %v", p, ok)
	}
	for _, count := range []int{2, 5, Max} {
		for _, p := range All(count) {
			got := ID(count, id, p)
			if len(got) != len(id) || got[:len(id)-1] != id[:len(id)-1] {
				t.Fatalf("ID(%d, %d) = %q: more than the last character changed", count, p, got)
			}
			back, ok := OfID(count, got)
			if !ok || back != p {
				t.Errorf("OfID(%d, ID(%d)) = %d %v", count, p, back, ok)
			}
		}
	}
	// An id whose last character names a partition the store does not have.
	if _, ok := OfID(2, ID(Max, id, 9)); ok {
		t.Error("OfID(2) accepted an id of partition 9")
	}
	if _, ok := OfID(2, ""); ok {
		t.Error("OfID accepted an empty id")
	}
}

func TestCheck(t *testing.T) {
	for _, n := range []int{0, -1, Max + 1} {
		if err := Check(n); !errors.Is(err, ErrCount) {
			t.Errorf("Check(%d) = %v", n, err)
		}
	}
	for _, n := range []int{1, 2, Max} {
		if err := Check(n); err != nil {
			t.Errorf("Check(%d) = %v", n, err)
		}
	}
}

func TestOfSubject(t *testing.T) {
	tests := map[string]P{"chunks.abc.J.1": 0, "p1.chunks.p1-abc.J.1": 1, "p12.jobs.run.x": 12, "p.x": 0, "px.y": 0, "pa1.x": 0, "p0.x": 0, "": 0, "p3": 0}
	for subj, want := range tests {
		if got := OfSubject(subj); got != want {
			t.Errorf("OfSubject(%q) = %d, want %d", subj, got, want)
		}
	}
	for _, p := range All(4) {
		if got := OfSubject(p.Subject("chunks.") + "k"); got != p {
			t.Errorf("OfSubject(P(%d).Subject) = %d", p, got)
		}
	}
}
