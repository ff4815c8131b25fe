package jsleader_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// TestGetWithoutMetaLeader: while the cluster's meta group has no leader (two of three servers
// down), the stream API refuses every message get ("JetStream system temporarily
// unavailable"), though a stream on the surviving server still has its leader and takes
// writes. Get then reads the last message on a subject through that leader all the same (a
// probe publish it refuses with the subject's last sequence, then a direct get), "not found"
// included; a stream that allows no direct get keeps the refusal.
func TestGetWithoutMetaLeader(t *testing.T) {
	// Both streams on the first server (tagged home), so that it alone can survive with them.
	c := testkit.RunCluster(t, 3, testkit.ServerTags(func(i int) []string {
		if i == 0 {
			return []string{"home"}
		}
		return nil
	}))
	home := &jetstream.Placement{Tags: []string{"home"}}
	nc, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true, Placement: home},
		{Name: "N", Subjects: []string{"n.>"}, Placement: home},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for _, subj := range []string{"s.a", "s.a", "n.a"} {
		m := nats.NewMsg(subj)
		m.Header.Set("X-Body", subj)
		m.Data = []byte(subj)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	const survivor = 0
	for i := 1; i < c.Size(); i++ {
		c.Stop(i)
	}
	nc.Close()
	snc, _ := c.ConnectTo(t, survivor)
	// Wait for the meta group to lose its leader: the stream API then refuses.
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		m, err := snc.RequestWithContext(ctx, jetstream.DefaultAPIPrefix+"STREAM.MSG.GET.S", []byte(`{"last_by_subj":"s.a"}`))
		if err != nil {
			return err
		}
		if !strings.Contains(string(m.Data), `"err_code":10008`) {
			return fmt.Errorf("the stream API still answers: %s", m.Data)
		}
		return nil
	})
	m, err := jsleader.Get(ctx, snc, jetstream.DefaultAPIPrefix, "S", jsleader.Request{LastBySubject: "s.a"})
	if err != nil {
		t.Fatalf("Get without a meta leader: %v", err)
	}
	h, herr := nats.DecodeHeadersMsg(m.Headers)
	if string(m.Data) != "s.a" || m.Seq != 2 || m.Subject != "s.a" || m.Time.IsZero() || herr != nil || h.Get("X-Body") != "s.a" || h.Get(jetstream.SequenceHeader) != "" {
		t.Fatalf("got seq %d subject %q %q at %v, headers %v (%v); want seq 2 s.a, its store time and its own headers", m.Seq, m.Subject, m.Data, m.Time, h, herr)
	}
	if _, err := jsleader.Get(ctx, snc, jetstream.DefaultAPIPrefix, "S", jsleader.Request{LastBySubject: "s.none"}); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("a subject with no message: %v, want ErrMsgNotFound", err)
	}
	var apiErr *jetstream.APIError
	if _, err := jsleader.Get(ctx, snc, jetstream.DefaultAPIPrefix, "N", jsleader.Request{LastBySubject: "n.a"}); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10008 {
		t.Fatalf("a stream without direct gets: %v, want the stream API's refusal", err)
	}
	// The probe stored nothing.
	if _, err := jsleader.Get(ctx, snc, jetstream.DefaultAPIPrefix, "S", jsleader.Request{LastBySubject: "s.a"}); err != nil {
		t.Fatal(err)
	}
}
