package jspub

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
)

func TestParseAck(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want *jetstream.PubAck
		fast bool   // read without encoding/json
		err  string // the error's text, when one
	}{
		{"stored", `{"stream":"KV_oncegate","seq":42}`, &jetstream.PubAck{Stream: "KV_oncegate", Sequence: 42}, true, ""},
		{"domain", `{"stream":"S","domain":"hub","seq":7}`, &jetstream.PubAck{Stream: "S", Domain: "hub", Sequence: 7}, true, ""},
		{"duplicate as the server writes it", `{"stream":"JOBS","seq":9,"duplicate": true}`, &jetstream.PubAck{Stream: "JOBS", Sequence: 9, Duplicate: true}, true, ""},
		{"duplicate without the space", `{"stream":"JOBS","seq":9,"duplicate":true}`, &jetstream.PubAck{Stream: "JOBS", Sequence: 9, Duplicate: true}, true, ""},
		{"largest sequence", `{"stream":"S","seq":18446744073709551615}`, &jetstream.PubAck{Stream: "S", Sequence: 1<<64 - 1}, true, ""},
		{"sequence 0", `{"stream":"S","seq":0}`, &jetstream.PubAck{Stream: "S"}, true, ""},
		{"batch ack", `{"stream":"LEDGER","seq":12,"batch":"b1","count":3}`, &jetstream.PubAck{Stream: "LEDGER", Sequence: 12}, false, ""},
		{"spaces", `{ "stream": "S", "seq": 3 }`, &jetstream.PubAck{Stream: "S", Sequence: 3}, false, ""},
		{"escaped name", `{"stream":"a\u0062","seq":3}`, &jetstream.PubAck{Stream: "ab", Sequence: 3}, false, ""},
		// jetstream wraps the APIError, whose text starts with "nats: " too.
		{"wrong last sequence", `{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 4"}}`, nil, false,
			"nats: nats: API error: code=400 err_code=10071 description=wrong last sequence: 4"},
		{"no stream", `{"seq":3}`, nil, false, jetstream.ErrInvalidJSAck.Error()},
		{"empty stream", `{"stream":"","seq":3}`, nil, false, jetstream.ErrInvalidJSAck.Error()},
		{"sequence overflows", `{"stream":"S","seq":18446744073709551616}`, nil, false, jetstream.ErrInvalidJSAck.Error()},
		{"leading zero", `{"stream":"S","seq":01}`, nil, false, jetstream.ErrInvalidJSAck.Error()},
		{"truncated", `{"stream":"S","seq":1`, nil, false, jetstream.ErrInvalidJSAck.Error()},
		{"not JSON", `+OK`, nil, false, jetstream.ErrInvalidJSAck.Error()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, fast := fastAck([]byte(tc.in))
			if fast != tc.fast {
				t.Errorf("fast path taken: %v, want %v", fast, tc.fast)
			}
			got, err := ParseAck([]byte(tc.in))
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("ParseAck = %+v, %v; want error %q", got, err, tc.err)
				}
				return
			}
			if err != nil || *got != *tc.want {
				t.Fatalf("ParseAck = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// FuzzParseAck: whatever the fast path reads, jetstream's own decoding reads the same.
func FuzzParseAck(f *testing.F) {
	for _, s := range []string{`{"stream":"KV_x","seq":1}`, `{"stream":"S","domain":"d","seq":99,"duplicate": true}`,
		`{"stream":"S","seq":00}`, `{"stream":"S\"","seq":1}`, `{"error":{"code":503,"err_code":10008}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fast, ok := fastAck(b)
		if !ok {
			return
		}
		ref, err := decodeAck(b)
		if err != nil {
			t.Fatalf("fast read %q as %+v; jetstream's decoding: %v", b, fast, err)
		}
		if *fast != *ref {
			t.Fatalf("fast read %q as %+v; jetstream's decoding as %+v", b, fast, ref)
		}
	})
}

// TestPublish runs Publish against a real server: a stored message, a duplicate, a refused
// expectation (jetstream's APIError, as errors.As finds it) and a subject no stream takes.
func TestPublish(t *testing.T) {
	s := testkit.RunJetStream(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	msg := func(subj, id string, last string) *nats.Msg {
		m := nats.NewMsg(subj)
		m.Data = []byte("x")
		if id != "" {
			m.Header.Set(jetstream.MsgIDHeader, id)
		}
		if last != "" {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, last)
		}
		return m
	}
	ack, err := Publish(ctx, s.NC, msg("s.a", "id-1", "0"))
	if err != nil || ack.Stream != "S" || ack.Sequence != 1 || ack.Duplicate {
		t.Fatalf("first publish: %+v, %v", ack, err)
	}
	ack, err = Publish(ctx, s.NC, msg("s.a", "id-1", ""))
	if err != nil || ack.Sequence != 1 || !ack.Duplicate {
		t.Fatalf("duplicate publish: %+v, %v", ack, err)
	}
	_, err = Publish(ctx, s.NC, msg("s.a", "", "0"))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("publish expecting an empty subject: %v, want err_code %d", err, jetstream.JSErrCodeStreamWrongLastSequence)
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if _, err = Publish(short, s.NC, msg("nostream.a", "", "")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("publish to no stream: %v, want %v", err, jetstream.ErrNoStreamResponse)
	}
	// Without a deadline of its own a publish gets jetstream's default.
	if ack, err = Publish(context.Background(), s.NC, msg("s.b", "", "")); err != nil || ack.Sequence != 2 {
		t.Fatalf("publish without a deadline: %+v, %v", ack, err)
	}
}

// BenchmarkPublish: one synchronous publish to a memory stream, through jetstream's PublishMsg
// and through Publish, on the same server and connection.
func BenchmarkPublish(b *testing.B) {
	s := testkit.RunJetStream(b, 0)
	ctx := context.Background()
	if _, err := s.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"},
		Storage: jetstream.MemoryStorage, MaxMsgsPerSubject: 1}); err != nil {
		b.Fatal(err)
	}
	payload := []byte(strings.Repeat("x", 200))
	for _, bc := range []struct {
		name string
		pub  func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error)
	}{
		{"jetstream", func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) { return s.JS.PublishMsg(ctx, m) }},
		{"jspub", func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) { return Publish(ctx, s.NC, m) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if _, err := bc.pub(ctx, &nats.Msg{Subject: "s.k", Data: payload}); err != nil {
					b.Fatal(err)
				}
				cancel()
			}
		})
	}
}

// BenchmarkParseAck: reading a stored message's ack as jetstream does and as ParseAck does.
func BenchmarkParseAck(b *testing.B) {
	ack := []byte(`{"stream":"KV_oncegate","seq":1234567}`)
	for _, bc := range []struct {
		name  string
		parse func([]byte) (*jetstream.PubAck, error)
	}{{"encoding-json", decodeAck}, {"ParseAck", ParseAck}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bc.parse(ack); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
