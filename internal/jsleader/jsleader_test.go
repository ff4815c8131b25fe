package jsleader_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/internal/jsleader"
	"github.com/oncegate/oncegate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGet: the last message on a subject with its headers, the next one from a sequence,
// "not found" as jetstream.ErrMsgNotFound, and a refusal as the server's *jetstream.APIError.
func TestGet(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := srv.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"a1", "b1", "a2"} {
		m := nats.NewMsg("s." + body[:1])
		m.Header.Set("X-Body", body)
		m.Data = []byte(body)
		if _, err := srv.JS.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name     string
		stream   string
		req      jsleader.Request
		data     string
		seq      uint64
		notFound bool
		apiError bool
	}{
		{"last on a subject", "S", jsleader.Request{LastBySubject: "s.a"}, "a2", 3, false, false},
		{"next on a subject from a sequence", "S", jsleader.Request{Seq: 2, NextBySubject: "s.a"}, "a2", 3, false, false},
		{"first on a subject", "S", jsleader.Request{NextBySubject: "s.b"}, "b1", 2, false, false},
		{"none past the last", "S", jsleader.Request{Seq: 4, NextBySubject: "s.a"}, "", 0, true, false},
		{"no such subject", "S", jsleader.Request{LastBySubject: "s.z"}, "", 0, true, false},
		{"no such stream", "NONE", jsleader.Request{LastBySubject: "s.a"}, "", 0, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := jsleader.Get(ctx, srv.NC, jetstream.DefaultAPIPrefix, tc.stream, tc.req)
			var apiErr *jetstream.APIError
			switch {
			case tc.notFound:
				if !errors.Is(err, jetstream.ErrMsgNotFound) {
					t.Fatalf("got %v, %v; want ErrMsgNotFound", m, err)
				}
			case tc.apiError:
				if !errors.As(err, &apiErr) {
					t.Fatalf("got %v, %v; want a *jetstream.APIError", m, err)
				}
			case err != nil:
				t.Fatal(err)
			default:
				h, herr := nats.DecodeHeadersMsg(m.Headers)
				if string(m.Data) != tc.data || m.Seq != tc.seq || herr != nil || h.Get("X-Body") != tc.data {
					t.Fatalf("got seq %d %q headers %v (%v); want seq %d %q", m.Seq, m.Data, h, herr, tc.seq, tc.data)
				}
				if m.Subject != "s."+tc.data[:1] || m.Time.IsZero() {
					t.Fatalf("got subject %q, stored at %v; want s.%s and its store time", m.Subject, m.Time, tc.data[:1])
				}
			}
		})
	}
}
