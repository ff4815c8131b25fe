package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

// chunkConsumers is the number of consumers the server holds on CHUNKS.
func chunkConsumers(ctx context.Context, js jetstream.JetStream) (int, error) {
	st, err := js.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Consumers, nil
}

// limitChunkConsumers sets a stream-level MaxConsumers on CHUNKS: the test servers lift the
// server default (1,000 per stream), and a stream limit still applies, as a stock server's
// default would.
func limitChunkConsumers(t *testing.T, js jetstream.JetStream, limit int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxConsumers = limit
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

func waitConsumers(t *testing.T, js jetstream.JetStream, want int) {
	t.Helper()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, err := chunkConsumers(ctx, js)
		if err != nil {
			return err
		}
		if n != want {
			return fmt.Errorf("CHUNKS has %d consumers, want %d", n, want)
		}
		return nil
	})
}

// TestFollowedExecutionsMakeNoConsumer (issue 44): executions followed without the core fast
// path (Open on one node, Join on another, as on a cluster) create no consumer per execution
// or per follower: each hub reads CHUNKS through its one tail, made by its first feed, so
// while 50 executions are followed CHUNKS holds the two tails and nothing else, only two
// consumer creations are asked for, and none is left once the hubs close. On one server and
// on a 3-node cluster (each node connected to any of its servers). Every follower reads every
// execution's chunks from index 0, whether it opened before the first chunk or joined after.
func TestFollowedExecutionsMakeNoConsumer(t *testing.T) {
	type conn struct {
		nc *nats.Conn
		js jetstream.JetStream
	}
	cases := map[string]func(t *testing.T) (a, b conn){
		"single": func(t *testing.T) (conn, conn) {
			srv := testkit.RunJetStream(t, time.Second)
			ncB, jsB := srv.Conn(t)
			return conn{srv.NC, srv.JS}, conn{ncB, jsB}
		},
		"cluster": func(t *testing.T) (conn, conn) {
			c := testkit.RunCluster(t, 3)
			ncA, jsA := c.Connect(t)
			ncB, jsB := c.Connect(t)
			return conn{ncA, jsA}, conn{ncB, jsB}
		},
	}
	for name, start := range cases {
		t.Run(name, func(t *testing.T) {
			a, b := start(t)
			followMany(t, a.nc, a.js, b.nc, b.js)
		})
	}
}

func followMany(t *testing.T, ncA *nats.Conn, jsA jetstream.JetStream, ncB *nats.Conn, jsB jetstream.JetStream) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The cluster's servers hold 256 MB of memory storage each, below CHUNKS' default cap.
	if err := jobs.EnsureStreams(ctx, jsA, jobs.StreamConfig{MaxChunkBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	creates := testkit.Watch(t, ncA, "$JS.API.CONSUMER.CREATE."+jobs.ChunksStream+".>")
	const executions = 50
	nodeA := jobs.NewHub(ncA, jsA, zerolog.Nop(), jobs.HubOptions{})
	nodeB := jobs.NewHub(ncB, jsB, zerolog.Nop(), jobs.HubOptions{})
	closed := false
	closeHubs := func() {
		if !closed {
			nodeA.Close()
			nodeB.Close()
			closed = true
		}
	}
	defer closeHubs()
	baseline, err := chunkConsumers(ctx, jsA)
	if err != nil {
		t.Fatal(err)
	}
	peak := baseline
	for i := range executions {
		job := newJob("leak" + strconv.Itoa(i))
		creator, err := nodeA.Open(ctx, job.Subject())
		if err != nil {
			t.Fatalf("execution %d: open: %v", i, err)
		}
		pub := jobs.NewPublisher(jsA, job)
		if err := pub.Publish(ctx, jobs.KindData, 0, []byte("p0")); err != nil {
			t.Fatal(err)
		}
		joiner, err := nodeB.Join(ctx, job.Subject())
		if err != nil {
			t.Fatalf("execution %d: join: %v", i, err)
		}
		n, err := chunkConsumers(ctx, jsA)
		if err != nil {
			t.Fatal(err)
		}
		peak = max(peak, n)
		if i%2 == 1 { // the followers leave before the end
			creator.Close()
			joiner.Close()
		}
		if err := pub.Publish(ctx, jobs.KindData, 0, []byte("p1")); err != nil {
			t.Fatal(err)
		}
		if err := pub.Publish(ctx, jobs.KindDone, 200, nil); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // the terminal chunk ends the feed
			checkSequence(t, readAll(t, creator), 2)
			checkSequence(t, readAll(t, joiner), 2)
			creator.Close()
			joiner.Close()
		}
	}
	if peak != baseline+2 {
		t.Fatalf("CHUNKS held at most %d consumers while %d executions were followed, want %d (one tail per hub)", peak, executions, baseline+2)
	}
	if nodeA.Active() != 0 || nodeB.Active() != 0 {
		t.Fatalf("hubs still follow %d and %d executions", nodeA.Active(), nodeB.Active())
	}
	closeHubs()
	waitConsumers(t, jsA, baseline)
	asked := 0
	for len(creates) > 0 {
		m := <-creates
		asked++
		// $JS.API.CONSUMER.CREATE.CHUNKS.<name>[.<filter>]
		name := strings.SplitN(strings.TrimPrefix(m.Subject, "$JS.API.CONSUMER.CREATE."+jobs.ChunksStream+"."), ".", 2)[0]
		if !jobs.IsTail(name) {
			t.Errorf("a CHUNKS consumer %q was asked for that is not a hub's tail", name)
		}
	}
	t.Logf("CHUNKS consumers: %d before, at most %d while %d executions were followed, %d after; %d creations asked for",
		baseline, peak, executions, baseline, asked)
	// One per hub. One run on a loaded machine (the whole suite at once) asked for a third, a
	// tail's (the cause was not found; the consumers held never exceeded two). A consumer per
	// execution would be 50 or more.
	if asked < 2 || asked > 4 {
		t.Fatalf("%d consumer creations for %d followed executions, want 2 (the hubs' tails; at most 4 with a retry each)", asked, executions)
	}
}

// TestOrphanConsumerExpires: when an API node dies while it follows an execution, nothing
// deletes its ordered consumer; the server must remove it soon by its inactive threshold, not
// after 5 minutes. On one server and on a 3-node cluster (the consumer may live on a server
// other than the dead node's).
func TestOrphanConsumerExpires(t *testing.T) {
	cases := map[string]func(t *testing.T) (admin, node jetstream.JetStream, nodeNC *nats.Conn){
		"single": func(t *testing.T) (jetstream.JetStream, jetstream.JetStream, *nats.Conn) {
			srv := testkit.RunJetStream(t, time.Second)
			nc, js := srv.Conn(t)
			return srv.JS, js, nc
		},
		"cluster": func(t *testing.T) (jetstream.JetStream, jetstream.JetStream, *nats.Conn) {
			c := testkit.RunCluster(t, 3)
			_, admin := c.Connect(t)
			nc, js := c.Connect(t)
			return admin, js, nc
		},
	}
	for name, start := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // most of each case is waiting for the server's threshold
			admin, js, nc := start(t)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := jobs.EnsureStreams(ctx, admin, jobs.StreamConfig{MaxChunkBytes: 64 << 20}); err != nil {
				t.Fatal(err)
			}
			node := jobs.NewHub(nc, js, zerolog.Nop(), jobs.HubOptions{})
			defer node.Close()
			fl, err := node.Join(ctx, newJob("orphan").Subject())
			if err != nil {
				t.Fatal(err)
			}
			defer fl.Close()
			waitConsumers(t, admin, 1)
			nc.Close() // the node dies: its hub can delete nothing
			testkit.CheckFor(t, 15*time.Second, 50*time.Millisecond, func() error {
				n, err := chunkConsumers(ctx, admin)
				if err != nil {
					return err
				}
				if n != 0 {
					return fmt.Errorf("CHUNKS still has %d consumers after their node died", n)
				}
				return nil
			})
		})
	}
}

// TestJoinRidesOutNoQuorum: a follower joins while CHUNKS (R3) has lost its quorum. Creating
// its ordered consumer is tried again until a leader is back, and the follower then reads
// the execution's output from the start. Before, the first failed creation was the answer
// (a 500 to the client).
func TestJoinRidesOutNoQuorum(t *testing.T) {
	c := testkit.RunCluster(t, 3)
	_, admin := c.Connect(t)
	nc, js := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, admin, jobs.StreamConfig{MaxChunkBytes: 64 << 20, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	job := newJob("quorum")
	if err := jobs.NewPublisher(admin, job).Publish(ctx, jobs.KindData, 0, []byte("p0")); err != nil {
		t.Fatal(err)
	}
	leader, other, survivor := c.LoseQuorum(jobs.ChunksStream)
	// The tail's first step is asking for the stream's end (its start sequence); without a
	// leader nobody answers it.
	tries := c.Watch(survivor, "$JS.API.STREAM.INFO."+jobs.ChunksStream)

	node := jobs.NewHub(nc, js, zerolog.Nop(), jobs.HubOptions{})
	defer node.Close()
	type joined struct {
		fl  *jobs.Follower
		err error
	}
	done := make(chan joined, 1)
	go func() {
		fl, err := node.Join(ctx, job.Subject())
		done <- joined{fl, err}
	}()
	for range 2 { // a second request is the hub trying again
		testkit.RequireChanRead(t, tries, 20*time.Second)
	}
	c.Restart(other)
	c.Restart(leader)
	j := testkit.RequireChanRead(t, done, 30*time.Second)
	if errors.Is(j.err, jobs.ErrUnavailable) {
		// The restarts and the election outlasted the join's 10 s window (a loaded CI
		// machine): the clean refusal (a 503 to the client) is the answer then.
		t.Skipf("the cluster took longer than the join's window to elect a leader: %v", j.err)
	}
	if j.err != nil {
		t.Fatalf("join without quorum, then with: %v, want it to follow once a leader is back", j.err)
	}
	defer j.fl.Close()
	ch, err := j.fl.Next(ctx)
	if err != nil || string(ch.Payload) != "p0" {
		t.Fatalf("first chunk %q %v, want p0", ch.Payload, err)
	}
}

// TestPublishRidesOutNoQuorum: a worker's chunk publish, or a taker's fence, made while CHUNKS
// (R3) has no leader is sent again until a leader is back, and stored once (the owner's chunk:
// the same expected last sequence). Before, the first failed publish ended the execution as a
// broken backend stream (FAILED stream_interrupted, the fault suite's rows 3a and 3b), and a
// lost fence left the old epoch's followers waiting.
func TestPublishRidesOutNoQuorum(t *testing.T) {
	cases := map[string]func(ctx context.Context, js jetstream.JetStream, job *jobs.Job, pub *jobs.Publisher) error{
		"chunk": func(ctx context.Context, _ jetstream.JetStream, _ *jobs.Job, pub *jobs.Publisher) error {
			return pub.Publish(ctx, jobs.KindData, 0, []byte("p1"))
		},
		"fence": func(ctx context.Context, js jetstream.JetStream, job *jobs.Job, _ *jobs.Publisher) error {
			return jobs.Fence(ctx, js, job.Key, job.ID, job.Epoch)
		},
	}
	for name, write := range cases {
		t.Run(name, func(t *testing.T) {
			c := testkit.RunCluster(t, 3)
			_, js := c.Connect(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := jobs.EnsureStreams(ctx, js, jobs.StreamConfig{MaxChunkBytes: 64 << 20, Replicas: 3}); err != nil {
				t.Fatal(err)
			}
			job := newJob("publish-quorum")
			pub := jobs.NewPublisher(js, job)
			if err := pub.Publish(ctx, jobs.KindData, 0, []byte("p0")); err != nil {
				t.Fatal(err)
			}
			leader, other, survivor := c.LoseQuorum(jobs.ChunksStream)
			tries := c.Watch(survivor, job.Subject())
			written := make(chan error, 1)
			go func() { written <- write(ctx, js, job, pub) }()
			for range 2 { // a second try is the writer sending it again
				testkit.RequireChanRead(t, tries, 20*time.Second)
			}
			c.Restart(other)
			c.Restart(leader)
			// Stored once if the cluster elected a leader within the writer's 10 s window, or
			// jobs.ErrUnavailable when the restarts and the election took longer (they can, on
			// a loaded machine): never a raw NATS error, never a second copy.
			err := testkit.RequireChanRead(t, written, 30*time.Second)
			want := uint64(2)
			switch {
			case errors.Is(err, jobs.ErrUnavailable):
				want = 0 // 1 or 2: a last try may have landed although it timed out
			case err != nil:
				t.Fatalf("%s without quorum, then with: %v, want it stored or ErrUnavailable", name, err)
			}
			st, err := js.Stream(ctx, jobs.ChunksStream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx, jetstream.WithSubjectFilter(job.Subject()))
			if err != nil {
				t.Fatal(err)
			}
			n := info.State.Subjects[job.Subject()]
			switch {
			case name == "fence" && (n < 2 && want != 0 || n < 1):
				t.Fatalf("the subject holds %d chunks after %v, want p0 and the fence", n, err)
			case name == "fence": // a fence written twice is harmless: followers stop at the first
			case n != want && (want != 0 || n < 1 || n > 2):
				t.Fatalf("the subject holds %d chunks after %v, want p0 and the chunk at most once", n, err)
			}
		})
	}
}

// TestResyncAfterChunksRecreated: a tail asks for the sequence after its last chunk, so on a
// CHUNKS recreated from sequence 1 (every server that held it restarted) it would wait for
// ever. Resync (called after a reconnect) finds the stream behind the tail, ends the open feeds
// with ErrChunksLost and reads the new stream from its end: a new execution is followed again.
// Without the resync the new execution's chunks never reach its follower.
func TestResyncAfterChunksRecreated(t *testing.T) {
	srv := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	node := jobs.NewHub(srv.NC, srv.JS, zerolog.Nop(), jobs.HubOptions{})
	defer node.Close()
	before := newJob("before")
	fl, err := node.Open(ctx, before.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	pub := jobs.NewPublisher(srv.JS, before)
	for i := range 3 {
		if err := pub.Publish(ctx, jobs.KindData, 0, []byte("p"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := fl.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.JS.DeleteStream(ctx, jobs.ChunksStream); err != nil {
		t.Fatal(err)
	}
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	if err := node.Resync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := fl.Next(ctx); !errors.Is(err, jobs.ErrChunksLost) {
		t.Fatalf("the open feed after CHUNKS was recreated: %v, want ErrChunksLost", err)
	}
	after := newJob("after")
	fl2, err := node.Open(ctx, after.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl2.Close()
	pub2 := jobs.NewPublisher(srv.JS, after)
	for i := range 2 {
		if err := pub2.Publish(ctx, jobs.KindData, 0, []byte("p"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub2.Publish(ctx, jobs.KindDone, 200, nil); err != nil {
		t.Fatal(err)
	}
	checkSequence(t, readAll(t, fl2), 2)
}

// TestTailRemadeBeforeItsFirstChunk: a tail whose consumer is lost before it read any chunk
// (on a cluster of notices it can go long without one) is made again by nats.go; a chunk stored
// in between still reaches its follower. Made with DeliverNew, the tail was made again from
// the stream's end and the chunk was lost (CI saw the first outcome of
// TestNoticesOnACluster lost that way under load).
func TestTailRemadeBeforeItsFirstChunk(t *testing.T) {
	ctx, nc, js, worker := chunksCluster(t)
	// A chunk before the hub exists, so that the tail's start is not the stream's first
	// sequence (from 1 it would read everything, whatever its policy).
	old := newJob("before-the-tail")
	if err := jobs.NewPublisher(worker, old).Publish(ctx, jobs.KindResult, 200, []byte(`{"old":true}`)); err != nil {
		t.Fatal(err)
	}
	hub := jobs.NewHub(nc, js, zerolog.Nop(), jobs.HubOptions{})
	t.Cleanup(hub.Close)
	if err := hub.StartTail(ctx); err != nil {
		t.Fatal(err)
	}
	job := newJob("tail-remade")
	fl, err := hub.OpenNonStream(ctx, job.Subject())
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	st, err := js.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		t.Fatal(err)
	}
	// The hub makes its tail in the background: wait until it is there (CI, under load: not
	// yet listed 0.43 s in).
	var tails []string
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		tails = tails[:0]
		for info := range st.ListConsumers(ctx).Info() {
			if jobs.IsTail(info.Name) {
				tails = append(tails, info.Name)
			}
		}
		if len(tails) != 1 {
			return fmt.Errorf("tails on CHUNKS: %v, want one", tails)
		}
		return nil
	})
	if err := js.DeleteConsumer(ctx, jobs.ChunksStream, tails[0]); err != nil {
		t.Fatal(err)
	}
	// At once: stored before nats.go has made the tail again.
	if err := jobs.NewPublisher(worker, job).Publish(ctx, jobs.KindResult, 200, []byte(`{"n":1}`)); err != nil {
		t.Fatal(err)
	}
	wait, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	ch, err := fl.Next(wait)
	if err != nil || string(ch.Payload) != `{"n":1}` {
		t.Fatalf("after the tail was made again: %q, %v; want the chunk stored in between", ch.Payload, err)
	}
}
