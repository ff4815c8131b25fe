package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/workers"
)

// TestLiveCopiesEndFromTheRecord: live stream copies that are mid-stream when their
// execution's last chunks are lost (a NATS partition or restart lost them, or the worker died
// between the record and the chunk) end from the record after a heartbeat of silence: the
// rest of its events and [DONE] (or its error event), byte for byte what a replay of the
// record sends, never a stream that waits until its client gives up. The API runs alone; the
// test is the worker: it publishes the first chunks, then writes the finished record and
// never publishes the rest.
func TestLiveCopiesEndFromTheRecord(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state kv.State
	}{
		{"completed", kv.Completed},
		{"failed after output", kv.Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			endFromRecord(t, tc.state)
		})
	}
}

func endFromRecord(t *testing.T, state kv.State) {
	cfg := gatewaykit.Config(t)
	cfg.Role = "api"
	cfg.NATS.Listen = "127.0.0.1:0"
	gw := gatewaykit.StartGateway(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	key := "xo-stranded-" + string(state)
	hdr := map[string]string{"Idempotency-Key": key}
	body := chatBody(slowModel, "stranded", `"stream":true`)
	wjs := gw.JetStream(t, "xo-worker")
	store, err := kv.Open(ctx, wjs, kv.BucketConfig{TTL: cfg.Idempotency.TTL.D()})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := wjs.Consumer(ctx, jobs.JobsStream, workers.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}

	// Two stream copies of the intent, the first creates it.
	a := followStream(gw.URL+chatPath, http.MethodPost, body, hdr)
	msg := fetchJob(t, cons)
	wire, err := jobs.Decode(msg.Headers(), msg.Data())
	if err != nil {
		t.Fatal(err)
	}
	rec, rev, err := store.Get(ctx, wire.Key)
	if err != nil {
		t.Fatal(err)
	}
	b := followStream(gw.URL+chatPath, http.MethodPost, body, hdr)
	// A synchronous job id is found through its execution's progress, which the worker (this
	// test plays it) writes as it sends the attempt; a client learns the id from the answer's
	// header, after that, but this test took it from JOBS.
	if err := store.PutProgress(wire.Key, &kv.Progress{JobID: rec.JobID, Epoch: rec.Epoch, Attempt: 1, Backend: "mock", Sent: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if r := send(http.MethodGet, gw.URL+"/v1/jobs/"+rec.JobID, "", nil); r.Err != nil || r.Status != http.StatusOK {
			return fmt.Errorf("job %s not found yet: %d %v", rec.JobID, r.Status, r.Err)
		}
		return nil
	})
	ev := followStream(gw.URL+"/v1/jobs/"+rec.JobID+"/events", http.MethodGet, "", nil)

	// The worker publishes two of its four frames; every copy sees them.
	pub := jobs.NewPublisher(wjs, intent.JobOf(wire.Key, rec))
	var frames []byte
	for i := range 4 {
		frames = append(frames, zombieFrame(i)...)
		if i < 2 {
			if err := pub.Publish(ctx, jobs.KindData, 0, zombieFrame(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, s := range map[string]*liveStream{"stream a": a, "stream b": b, "job events": ev} {
		s.waitEvents(t, ctx, name, 2)
	}

	// It finishes the record with all four frames, and its last two chunks and the terminal
	// one are lost.
	done := *rec
	done.State = state
	done.Request = nil
	done.Result = &kv.Result{Status: http.StatusOK, Events: frames, Finished: time.Now()}
	if state == kv.Failed {
		done.Result.Partial = true
		done.Result.Body = []byte(`{"error":{"message":"the model backend's stream broke","type":"server_error","code":"backend_stream_broken"}}`)
	}
	if _, err := store.Update(ctx, wire.Key, &done, rev); err != nil {
		t.Fatal(err)
	}
	if err := msg.Ack(); err != nil {
		t.Fatal(err)
	}

	// Every copy ends as a replay of the record does (asked once they ended: while this node
	// follows the execution a new copy joins it).
	ended := map[string][]byte{}
	for name, s := range map[string]*liveStream{"stream a": a, "stream b": b, "job events": ev} {
		ended[name] = s.wait(t, ctx, name)
	}
	replay := postChat(t, gw.URL, body, hdr)
	expect(t, replay, http.StatusOK, "replayed")
	if !bytes.HasPrefix(replay.Body, frames) {
		t.Fatalf("the replay does not carry the record's frames: %q", replay.Body)
	}
	for _, name := range []string{"stream a", "stream b"} {
		if !bytes.Equal(ended[name], replay.Body) {
			t.Errorf("%s: got %q\nwant the replay's %q", name, ended[name], replay.Body)
		}
	}
	resp, err := http.Get(gw.URL + "/v1/jobs/" + rec.JobID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	whole, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("job events after the end: %d %v", resp.StatusCode, err)
	}
	if !bytes.Equal(ended["job events"], whole) {
		t.Errorf("job events: got %q\nwant the finished job's %q", ended["job events"], whole)
	}
	wantEnd := "data: [DONE]\n\n"
	if state == kv.Failed {
		wantEnd = "data: " + string(done.Result.Body) + "\n\n"
	}
	if !strings.HasSuffix(string(replay.Body), wantEnd) {
		t.Errorf("the stream ends %q, want %q", replay.Body, wantEnd)
	}
}

// fetchJob is the next job of the shared consumer, taken as a worker takes it.
func fetchJob(t *testing.T, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg := <-batch.Messages()
	if msg == nil {
		t.Fatalf("no job delivered: %v", batch.Error())
	}
	return msg
}

// liveStream is an SSE response read in the background: the count of events so far, then
// the whole body without heartbeats.
type liveStream struct {
	events chan int
	done   chan streamEnd
}

type streamEnd struct {
	status int
	raw    []byte
	err    error
}

func followStream(url, method, body string, hdr map[string]string) *liveStream {
	s := &liveStream{events: make(chan int, 64), done: make(chan streamEnd, 1)}
	go func() {
		defer close(s.events)
		resp, err := openStream(method, url, body, hdr)
		if err != nil {
			s.done <- streamEnd{err: err}
			return
		}
		defer resp.Body.Close()
		r := newSSEReader(resp.Body)
		for n := 1; ; n++ {
			if _, err := r.next(); err != nil {
				if err == io.EOF {
					err = nil
				}
				raw := bytes.ReplaceAll(r.raw.Bytes(), []byte(": ping\n\n"), nil)
				s.done <- streamEnd{status: resp.StatusCode, raw: raw, err: err}
				return
			}
			select { // never blocks: the reader only needs the latest count
			case s.events <- n:
			default:
			}
		}
	}()
	return s
}

// waitEvents waits until the stream has n events.
func (s *liveStream) waitEvents(t *testing.T, ctx context.Context, name string, n int) {
	t.Helper()
	for seen := 0; seen < n; {
		select {
		case got, ok := <-s.events:
			if !ok {
				e := <-s.done
				t.Fatalf("%s ended after %d events, want %d first (status %d, %v): %.300s", name, seen, n, e.status, e.err, e.raw)
			}
			seen = got
		case <-ctx.Done():
			t.Fatalf("%s: %d events, want %d", name, seen, n)
		}
	}
}

// wait is the whole stream once it ended.
func (s *liveStream) wait(t *testing.T, ctx context.Context, name string) []byte {
	t.Helper()
	select {
	case e := <-s.done:
		if e.err != nil || e.status != http.StatusOK {
			t.Fatalf("%s: status %d, %v", name, e.status, e.err)
		}
		return e.raw
	case <-ctx.Done():
		t.Fatalf("%s never ended: its terminal chunk is lost and it did not read the record", name)
		return nil
	}
}
