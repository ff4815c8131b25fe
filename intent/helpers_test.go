package intent_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
	"github.com/oncegate/oncegate/kv"
	"github.com/oncegate/oncegate/ledger"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The idempotency settings of every test core. The clock is the test's, so the lease and the
// window only pass when a test moves it; the lease is longer than the window so an auto key
// can leave its window while its execution's lease still runs.
const (
	tenant     = "acme"
	lease      = time.Minute
	autoWindow = 10 * time.Second
	recordTTL  = time.Hour
)

// clock is the cores' controllable clock (Deps.Now), in nanoseconds since the epoch.
type clock struct{ ns atomic.Int64 }

func (c *clock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) Add(d time.Duration) { c.ns.Add(int64(d)) }

// env is one real JetStream with the streams and bucket the gateway creates, and the core of
// one API node on it. No workers run: tests play the worker with take, finish and publisher.
type env struct {
	srv   *testkit.JetStream
	store *kv.Store
	clock *clock
	core  *intent.Core
	hub   *jobs.Hub // core's
	// conns are the connections the nodes publish on (the first one also the test worker's).
	conns []*nats.Conn
	// Spies on the subjects admission writes and reads.
	records *spy // claim and update attempts on the IDEM bucket
	reads   *spy // record reads (the bucket's direct get)
	jobs    *spy // job publishes to JOBS
}

func newEnv(t *testing.T, budgets intent.Budgeter) *env {
	t.Helper()
	srv := testkit.RunJetStream(t, 0)
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	store, err := kv.Open(ctx, srv.JS, kv.BucketConfig{TTL: recordTTL})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{srv: srv, store: store, clock: &clock{}, conns: []*nats.Conn{srv.NC}}
	e.clock.ns.Store(time.Now().UnixNano())
	e.core, e.hub = e.node(t, srv.NC, srv.JS, budgets)
	e.records = e.spy(t, "$KV."+kv.Bucket+".>")
	e.reads = e.spy(t, "$JS.API.DIRECT.GET.KV_"+kv.Bucket+".>")
	e.jobs = e.spy(t, jobs.JobsSubjects)
	return e
}

// node is the core of an API node on connection nc, with its own store handle and hub (as
// gateway builds them), sharing e's JetStream and clock; mods change its deps.
func (e *env) node(t *testing.T, nc *nats.Conn, js jetstream.JetStream, budgets intent.Budgeter, mods ...func(*intent.Deps)) (*intent.Core, *jobs.Hub) {
	t.Helper()
	store, err := kv.Open(context.Background(), js, kv.BucketConfig{TTL: recordTTL})
	if err != nil {
		t.Fatal(err)
	}
	hub := jobs.NewHub(nc, js, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true})
	t.Cleanup(hub.Close)
	d := intent.Deps{JS: js, Store: store, Hub: hub, Budgets: budgets, Log: zerolog.Nop(), Now: e.clock.Now,
		Options: intent.Options{Lease: lease, TTL: recordTTL, AutoWindow: autoWindow, ReplayCacheBytes: 1 << 20}}
	for _, m := range mods {
		m(&d)
	}
	return intent.New(d), hub
}

// otherNode is a second API node on its own connection to the same JetStream; mods change its
// deps.
func (e *env) otherNode(t *testing.T, mods ...func(*intent.Deps)) *intent.Core {
	t.Helper()
	nc, js := e.srv.Conn(t)
	e.conns = append(e.conns, nc)
	c, _ := e.node(t, nc, js, nil, mods...)
	return c
}

// request is a chat request of tenant with the client key key.
func request(key string) *intent.Request {
	return &intent.Request{Tenant: tenant, Key: intent.RecordKey(1, tenant, key), Fingerprint: "fp-" + key,
		Model: "oncegate-mock", API: "openai", Backends: []string{"mock"},
		Body: []byte(`{"model":"oncegate-mock","messages":[{"role":"user","content":"` + key + `"}]}`)}
}

// autoRequest is a request sent without a key: its record key is derived from its content.
func autoRequest(content string) *intent.Request {
	req := request(content)
	req.Key, req.Auto = intent.AutoKey(1, tenant, "POST", "/v1/chat/completions", req.Fingerprint), true
	return req
}

// admit is c.Admit that must succeed; the admission is closed when the test ends.
func admit(t *testing.T, c *intent.Core, req *intent.Request) *intent.Admission {
	t.Helper()
	adm, err := c.Admit(context.Background(), req)
	if err != nil {
		t.Fatalf("admit: %v", err)
	}
	t.Cleanup(adm.Close)
	return adm
}

func (e *env) get(t *testing.T, key string) (*kv.Record, uint64) {
	t.Helper()
	rec, rev, err := e.store.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return rec, rev
}

// take plays a worker receiving key's job: it fetches the job from JOBS and acks it, so JOBS
// no longer holds it.
func (e *env) take(t *testing.T, key string) *jobs.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := e.srv.JS.CreateConsumer(ctx, jobs.JobsStream, jetstream.ConsumerConfig{
		FilterSubject: strings.TrimSuffix(jobs.JobsSubjects, ">") + key, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.srv.JS.DeleteConsumer(ctx, jobs.JobsStream, cons.CachedInfo().Name) }()
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("no job of %s in JOBS: %v", key, err)
	}
	job, err := jobs.Decode(msg.Headers(), msg.Data())
	if err != nil {
		t.Fatal(err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	return job
}

// finish plays a worker's end of an epoch that has no chunks yet, in the worker's order: the
// record becomes state with res, without its request and lease (as workers/execution.go
// writeFinal writes it), then the terminal chunk ends the feed.
func (e *env) finish(t *testing.T, key string, state kv.State, res kv.Result) {
	t.Helper()
	rec := e.finishRecord(t, key, state, res)
	kind := jobs.KindResult
	if state == kv.Failed {
		kind = jobs.KindError
	}
	if err := jobs.NewPublisher(e.srv.JS, intent.JobOf(key, rec)).Publish(context.Background(), kind, res.Status, res.Body); err != nil {
		t.Fatal(err)
	}
}

// finishRecord is finish without the terminal chunk (a worker that died between the two); it
// returns the record as it was before.
func (e *env) finishRecord(t *testing.T, key string, state kv.State, res kv.Result) *kv.Record {
	t.Helper()
	ctx := context.Background()
	rec, rev := e.get(t, key)
	next := *rec
	res.Finished = e.clock.Now()
	next.State, next.Result, next.Request = state, &res, nil
	next.Progress, next.LeaseUntil, next.Worker = kv.ProgressFinished, time.Time{}, "test-worker"
	if _, err := e.store.Update(ctx, key, &next, rev); err != nil {
		t.Fatal(err)
	}
	return rec
}

// publisher writes the chunks of the current epoch of key's record, as its worker would.
func (e *env) publisher(t *testing.T, key string) *jobs.Publisher {
	t.Helper()
	rec, _ := e.get(t, key)
	return jobs.NewPublisher(e.srv.JS, intent.JobOf(key, rec))
}

// next reads the next event of adm's delivery (a chunk, or how it ended), past its silences.
func next(t *testing.T, adm *intent.Admission) intent.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := nextEvent(ctx, adm)
	if err != nil {
		t.Fatalf("next chunk: %v", err)
	}
	return ev
}

// nextEvent is the next event of adm's delivery that is not Idle.
func nextEvent(ctx context.Context, adm *intent.Admission) (intent.Event, error) {
	for {
		ev, err := adm.Delivery().Next(ctx)
		if err != nil || ev.Kind != intent.Idle {
			return ev, err
		}
	}
}

// spy sees every message published on a subject, by anyone: a core subscription gets a copy
// even of a publish JetStream refuses (a failed claim) or drops as a duplicate (a job
// re-published with the same message id), so it counts attempts, not only writes.
type spy struct {
	e   *env
	nc  *nats.Conn
	sub *nats.Subscription
}

func (e *env) spy(t *testing.T, subject string) *spy {
	t.Helper()
	nc, _ := e.srv.Conn(t)
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &spy{e: e, nc: nc, sub: sub}
}

// count is the number of messages whose subject ends in "."+key seen since the last count
// (every message when key is empty). A JetStream ack can overtake the copy of its message
// to this subscriber, so first each publishing connection's flush: the server answers it only
// after it has routed everything that connection sent before; then this connection's flush,
// answered after those copies.
func (s *spy) count(t *testing.T, key string) int {
	t.Helper()
	for _, nc := range append(s.e.conns, s.nc) {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	queued, _, err := s.sub.Pending()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range queued {
		m, err := s.sub.NextMsg(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if key == "" || strings.HasSuffix(m.Subject, "."+key) {
			n++
		}
	}
	return n
}

// budget is a Budgeter whose refusal the test switches (the ledger's Budgets has its own
// tests; admission only needs the consumer-side contract).
type budget struct {
	refuse   atomic.Bool
	reserved atomic.Int32
}

func (b *budget) Admit(_ context.Context, tenant string, _ ledger.Ask) (int64, func(int64), error) {
	if b.refuse.Load() {
		return 0, nil, fmt.Errorf("%w: tenant %s", ledger.ErrBudgetExceeded, tenant)
	}
	b.reserved.Add(1)
	return 0, func(int64) {}, nil
}

// A seed brings req's key into a state through the core itself (and the test's worker), and
// returns the admission that created its execution (nil: none).
type seed func(t *testing.T, e *env, req *intent.Request) *intent.Admission

// pending: an execution was created and is queued; nobody on this node follows it any more.
func pending(t *testing.T, e *env, req *intent.Request) *intent.Admission {
	t.Helper()
	adm := admit(t, e.core, req)
	adm.Close()
	return adm
}

// finished: a worker took the job and stored state with res.
func finished(state kv.State, res kv.Result) seed {
	return func(t *testing.T, e *env, req *intent.Request) *intent.Admission {
		t.Helper()
		adm := pending(t, e, req)
		e.take(t, adm.Key)
		e.finish(t, adm.Key, state, res)
		return adm
	}
}

var (
	completed = finished(kv.Completed, kv.Result{Status: 200, Body: []byte(`{"choices":[]}`)})
	// retryable: a failure before any output (the key may be claimed again).
	retryable = finished(kv.Failed, kv.Result{Status: 503, Retryable: true})
	// permanent: the backend refused the request (4xx): its answer is the intent's outcome.
	permanent = finished(kv.Failed, kv.Result{Status: 400, Body: []byte(`{"error":{"message":"bad"}}`)})
)

// cancelBody is the error body a cancellation stores and sends, in the request's format.
func cancelBody(api string) []byte {
	return []byte(`{"error":{"message":"cancelled","format":"` + api + `"}}`)
}

// cancelled: the client cancelled the execution while it was queued.
func cancelled(t *testing.T, e *env, req *intent.Request) *intent.Admission {
	t.Helper()
	async := *req
	async.Async = true // indexed synchronously, so the job id finds its record at once
	adm := pending(t, e, &async)
	if _, err := e.core.Cancel(context.Background(), tenant, adm.JobID, cancelBody); err != nil {
		t.Fatal(err)
	}
	return adm
}
