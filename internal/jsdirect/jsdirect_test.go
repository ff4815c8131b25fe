package jsdirect_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/internal/jsdirect"
	"github.com/oncegate/oncegate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBatch: a subject's messages from a sequence in batches (full while more may follow, also
// when the answer is cut at its bytes),
// a wildcard filter, none on a subject without messages, and no responders from a stream that
// does not allow direct gets.
func TestBatch(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true},
		{Name: "NODIRECT", Subjects: []string{"n.>"}},
	} {
		if _, err := srv.JS.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for _, subject := range []string{"s.a", "s.b", "s.a", "s.a", "s.b"} { // seqs 1-5
		m := nats.NewMsg(subject)
		m.Header.Set("X-Subject", subject)
		if _, err := srv.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name    string
		stream  string
		subject string
		from    uint64
		n       int
		max     int
		seqs    []uint64
		full    bool
		err     error
	}{
		{"a full batch", "S", "s.a", 0, 2, 0, []uint64{1, 3}, true, nil},
		{"the rest from a sequence", "S", "s.a", 4, 10, 0, []uint64{4}, false, nil},
		{"a wildcard", "S", "s.>", 2, 10, 0, []uint64{2, 3, 4, 5}, false, nil},
		{"every subject", "S", "", 2, 2, 0, []uint64{2, 3}, true, nil},
		{"nothing past the last", "S", "s.b", 6, 10, 0, nil, false, nil},
		{"no such subject", "S", "s.z", 0, 10, 0, nil, false, nil},
		{"no direct gets", "NODIRECT", "n.a", 0, 10, 0, nil, false, nats.ErrNoResponders},
		// Each message is about 30 bytes of subject and header: the answer is cut after two.
		{"cut at max bytes, more left", "S", "s.>", 1, 10, 40, []uint64{1, 2}, true, nil},
		{"cut at max bytes, none left", "S", "s.>", 4, 10, 40, []uint64{4, 5}, false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msgs, full, err := jsdirect.BatchMax(ctx, srv.NC, jetstream.DefaultAPIPrefix, tc.stream, tc.subject, tc.from, tc.n, tc.max)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			var seqs []uint64
			for _, m := range msgs {
				if m.Header.Get("X-Subject") != m.Subject {
					t.Errorf("seq %d: subject %q, header %q", m.Seq, m.Subject, m.Header.Get("X-Subject"))
				}
				seqs = append(seqs, m.Seq)
			}
			if len(seqs) != len(tc.seqs) || full != tc.full {
				t.Fatalf("seqs %v full %v, want %v %v", seqs, full, tc.seqs, tc.full)
			}
			for i := range seqs {
				if seqs[i] != tc.seqs[i] {
					t.Fatalf("seqs %v, want %v", seqs, tc.seqs)
				}
			}
		})
	}
}
