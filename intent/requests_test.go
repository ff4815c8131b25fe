package intent_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/kv"
)

// largeRequest is request(key) with a prompt above kv.DefaultInlineRequestMax.
func largeRequest(key string) *intent.Request {
	req := request(key)
	req.Body = []byte(`{"model":"oncegate-mock","messages":[{"role":"user","content":"` + key + strings.Repeat("x", kv.DefaultInlineRequestMax) + `"}]}`)
	return req
}

// storedBytes is the size of key's record as the bucket stores it.
func (e *env) storedBytes(t *testing.T, key string) int {
	t.Helper()
	ctx := context.Background()
	bucket, err := e.srv.JS.KeyValue(ctx, kv.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := bucket.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return len(entry.Value())
}

// jobRequest takes key's job from JOBS and returns the request it runs: the one its record
// carries, or the one in REQUESTS that it names (it must not carry that one as well).
func (e *env) jobRequest(t *testing.T, key string) (*kv.Record, []byte) {
	t.Helper()
	job := e.take(t, key)
	rec, err := kv.Decode(job.Record)
	if err != nil {
		t.Fatal(err)
	}
	if rec.RequestAt == 0 {
		return rec, rec.Request
	}
	if len(rec.Request) > 0 || len(job.Request) > 0 || !job.RequestStored {
		t.Fatalf("the job of a stored request carries %d+%d request bytes, names REQUESTS: %v; want 0, true", len(rec.Request), len(job.Request), job.RequestStored)
	}
	body, err := e.store.Request(context.Background(), key, rec)
	if err != nil {
		t.Fatalf("the request the job names: %v", err)
	}
	return rec, body
}

// TestLargeRequestIsStoredOut: a request too large for its record is stored in REQUESTS, so
// the record stays small (every renewal and read pays for it), and the job message names it
// (its worker reads it there); a takeover re-drives it with the stored bytes.
func TestLargeRequestIsStoredOut(t *testing.T) {
	e := newEnv(t, nil)
	req := largeRequest(t.Name())
	first := admit(t, e.core, req)
	if first.Outcome != intent.Created {
		t.Fatalf("first: %s", first.Outcome)
	}
	rec, _ := e.get(t, req.Key)
	if len(rec.Request) != 0 || rec.RequestAt != 1 || rec.RequestBytes != len(req.Body) {
		t.Fatalf("record carries %d request bytes, names epoch %d, %d bytes; want 0, 1, %d", len(rec.Request), rec.RequestAt, rec.RequestBytes, len(req.Body))
	}
	if n := e.storedBytes(t, req.Key); n > 2048 {
		t.Fatalf("the stored record is %d bytes for a %d-byte request", n, len(req.Body))
	}
	if _, body := e.jobRequest(t, req.Key); !bytes.Equal(body, req.Body) {
		t.Fatalf("the job runs %d request bytes, want the %d sent", len(body), len(req.Body))
	}

	// Its worker took the job and vanished: a copy's takeover reads the request back.
	e.clock.Add(lease + time.Second)
	adm := admit(t, e.otherNode(t), req)
	if rec, _ := e.get(t, req.Key); adm.Outcome != intent.Joined || rec.Epoch != 2 || rec.Takeovers != 1 {
		t.Fatalf("copy: %s, record epoch %d, %d takeovers; want joined epoch 2 after a takeover", adm.Outcome, rec.Epoch, rec.Takeovers)
	}
	if jrec, body := e.jobRequest(t, req.Key); jrec.Epoch != 2 || !bytes.Equal(body, req.Body) {
		t.Fatalf("the re-driven job (epoch %d) runs %d request bytes, want %d", jrec.Epoch, len(body), len(req.Body))
	}
}

// TestLostStoredRequest: a record naming a stored request REQUESTS does not hold whole (its
// claim's node died between the claim and storing it; here, one piece is gone) is failed by the takeover that finds it so.
// When nothing of it can have run, the copy that found it claims the key again with its own
// request and executes once; when an attempt may have run, the failure is kept and replayed.
func TestLostStoredRequest(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name string
		sent bool // the vanished worker's progress says an attempt was sent
		want intent.Outcome
	}{
		{name: "never sent", want: intent.Created},
		{name: "attempt sent", sent: true, want: intent.Replayed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			req := largeRequest(t.Name())
			admit(t, e.core, req)
			job := e.take(t, req.Key)
			if tc.sent {
				if err := e.store.PutProgress(req.Key, &kv.Progress{JobID: job.ID, Epoch: 1, Attempt: 1, Backend: "mock", Sent: e.clock.Now()}); err != nil {
					t.Fatal(err)
				}
			}
			st, err := e.srv.JS.Stream(ctx, kv.RequestsStream)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Purge(ctx, jetstream.WithPurgeSubject("requests."+req.Key+".1.1")); err != nil { // its second piece
				t.Fatal(err)
			}
			e.clock.Add(lease + time.Second)
			adm := admit(t, e.otherNode(t), req)
			rec, _ := e.get(t, req.Key)
			if adm.Outcome != tc.want {
				t.Fatalf("copy: %s, want %s (record %s epoch %d)", adm.Outcome, tc.want, rec.State, rec.Epoch)
			}
			switch tc.want {
			case intent.Created:
				if rec.State != kv.Pending || rec.Epoch != 3 || rec.RequestAt != 3 {
					t.Fatalf("record %s epoch %d, request at %d; want PENDING 3 at 3", rec.State, rec.Epoch, rec.RequestAt)
				}
				if got, err := e.store.Request(ctx, req.Key, rec); err != nil || !bytes.Equal(got, req.Body) {
					t.Fatalf("the reclaim's stored request: %d bytes, %v", len(got), err)
				}
				if _, body := e.jobRequest(t, req.Key); !bytes.Equal(body, req.Body) {
					t.Fatalf("the new job runs %d request bytes, want %d", len(body), len(req.Body))
				}
			default:
				if rec.State != kv.Failed || rec.Result.Retryable || rec.Result.Status != http.StatusServiceUnavailable || len(rec.Unfinished) != 1 {
					t.Fatalf("record %s, result %+v, %d unfinished; want a kept 503 with the sent attempt unfinished", rec.State, rec.Result, len(rec.Unfinished))
				}
			}
		})
	}
}

// offers records what a node's workers were offered (intent.Offerer) and what was withdrawn.
type offers struct {
	mu        sync.Mutex
	held      map[string]*kv.Record // by key.epoch.rev
	withdrawn []string
}

func (o *offers) Offer(key string, epoch int, rev uint64, rec *kv.Record) func() {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := fmt.Sprintf("%s.%d.%d", key, epoch, rev)
	o.held[k] = rec
	return func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		delete(o.held, k)
		o.withdrawn = append(o.withdrawn, k)
	}
}

func (o *offers) state() (held map[string]*kv.Record, withdrawn []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.held), slices.Clone(o.withdrawn)
}

// TestJobRecordIsOffered: each job a node submits offers its record, as the claim wrote it and
// with its request (also one stored in REQUESTS, which the job only names), to the node's
// workers from before the job is published until its admission is closed, so a worker of the
// node need not decode it or read the request back; a copy that joins offers nothing.
func TestJobRecordIsOffered(t *testing.T) {
	e := newEnv(t, nil)
	o := &offers{held: map[string]*kv.Record{}}
	core, _ := e.node(t, e.srv.NC, e.srv.JS, nil, func(d *intent.Deps) { d.Offer = o })
	for _, tc := range []struct {
		name string
		req  *intent.Request
	}{
		{name: "large", req: largeRequest(t.Name() + "-large")},
		{name: "small", req: request(t.Name() + "-small")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			adm, err := core.Admit(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			_, rev := e.get(t, req.Key)
			k := fmt.Sprintf("%s.1.%d", req.Key, rev)
			held, _ := o.state()
			if rec := held[k]; len(held) != 1 || rec == nil || rec.JobID != adm.JobID || !bytes.Equal(rec.Request, req.Body) {
				t.Fatalf("offered %d records; want %s's claim (job %s, its %d request bytes)", len(held), k, adm.JobID, len(req.Body))
			}
			e.take(t, req.Key)
			if copyAdm := admit(t, core, req); copyAdm.Outcome != intent.Joined {
				t.Fatalf("copy: %s, want joined", copyAdm.Outcome)
			}
			if held, _ := o.state(); len(held) != 1 {
				t.Fatalf("after a join: %d offers held, want 1", len(held))
			}
			adm.Close()
			if held, withdrawn := o.state(); len(held) != 0 || !slices.Contains(withdrawn, k) {
				t.Fatalf("after the admission's close: %d offers held, withdrawn %q; want none held, %s withdrawn", len(held), withdrawn, k)
			}
		})
	}
}
