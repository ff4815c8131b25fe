package e2e

// The fault suite's harness (issue 12, notes/reliability-matrix.md §7.1): a 3-node NATS
// cluster in the test process, the mock backend as a real process behind a recorder that
// counts executions per intent and per worker, two API processes and two worker processes
// on that cluster, each with its own config file. Faults are real signals (SIGKILL,
// SIGSTOP/SIGCONT) to real processes; every random choice comes from -chaos.seed.
//
// The recorder is a pass-through on 127.0.0.1 between the workers and the mock process: the
// mock's own /stats counts requests for all intents together, and the invariants need them
// per intent (I1) and per worker (row 1b: the zombie's execution). Each worker's config
// points its backend at its own path prefix (/w0/v1, /w1/v1), so the recorder knows who
// called; the mock's /stats total is checked against the recorder's at the end of a row.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

var (
	chaosSeed   = flag.Uint64("chaos.seed", 1, "seed of every random choice of the fault suite")
	chaosTrials = flag.Int("chaos.trials", 0, "fault injections per row (default 3, or 100 with -chaos.long)")
	chaosLong   = flag.Bool("chaos.long", false, "long fault suite: more trials, and print the table")
	chaosWarn   = flag.Bool("chaos.warnings", false, "print the gateway processes' warnings after each trial of a NATS row, not only their errors")
)

// The harness's timing. The lease is short so a takeover happens within seconds; the mock
// is paced so a generation lasts 1-3 s (20-60 tokens at 50 ms).
const (
	chaosLease      = 2 * time.Second
	chaosInterToken = 50 * time.Millisecond
	chaosMinTokens  = 20
	chaosMaxTokens  = 60
	// chaosDeadline is every copy's Oncegate-Timeout: the intent's deadline for I5.
	chaosDeadline = 30 * time.Second
	// chaosSettle bounds the waits for the system to settle (records terminal, consumers and
	// connections back to baseline, the ledger reconciled): the product's own periods
	// (lease, sweep, reconcile, the 5 s orphan expiry) plus room for a shared CPU.
	chaosSettle = 40 * time.Second
)

func chaosTrialCount() int {
	switch {
	case *chaosTrials > 0:
		return *chaosTrials
	case *chaosLong:
		return 100
	}
	return 3
}

// ---- the recorder in front of the mock process ----

// execution is one backend call the recorder relayed.
type execution struct {
	intent     string // the first message's content: unique per intent in the suite
	worker     int    // the worker slot whose backend URL was called
	start, end time.Time
	bytes      int
	ended      bool
	// completed: the mock's answer was read to its end and every byte of it written to the
	// worker. Not "the worker read to EOF": a worker stops reading at [DONE] and closes the
	// connection without waiting for the chunked terminator, which cancels the request's
	// context while the recorder is still reading the mock's last empty read.
	completed bool
	// faulted: the worker was killed or paused while this call ran. Its answer, even read to
	// the end, is not the outcome: an ambiguous attempt (the takeover runs the intent again).
	faulted bool
}

// recorder relays /w{slot}/… to the mock process and records every chat completion.
type recorder struct {
	srv    *httptest.Server
	mock   string // the mock process's base URL (http://addr)
	client *http.Client

	mu    sync.Mutex
	execs []*execution
	// byIntent indexes execs: the soak checks tens of thousands of intents at its end.
	byIntent map[string][]*execution
}

func startRecorder(t testing.TB, mockBase string) *recorder {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	r := &recorder{mock: mockBase, client: &http.Client{Transport: tr}, byIntent: map[string][]*execution{}}
	r.srv = httptest.NewServer(r)
	t.Cleanup(func() {
		r.srv.Close()
		tr.CloseIdleConnections()
	})
	return r
}

// workerBase is the OpenAI base URL worker slot uses.
func (r *recorder) workerBase(slot int) string { return fmt.Sprintf("%s/w%d/v1", r.srv.URL, slot) }

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	prefix, rest, ok := strings.Cut(strings.TrimPrefix(req.URL.Path, "/w"), "/")
	slot, err := strconv.Atoi(prefix)
	if !ok || err != nil {
		http.NotFound(w, req)
		return
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	var ex *execution
	if req.Method == http.MethodPost && rest == "v1/chat/completions" {
		var m struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(body, &m)
		ex = &execution{worker: slot, start: time.Now()}
		if len(m.Messages) > 0 {
			ex.intent = m.Messages[0].Content
		}
		r.mu.Lock()
		r.execs = append(r.execs, ex)
		r.byIntent[ex.intent] = append(r.byIntent[ex.intent], ex)
		r.mu.Unlock()
	}
	completed := r.relay(w, req, "/"+rest, body, ex)
	if ex != nil {
		r.mu.Lock()
		ex.end, ex.ended, ex.completed = time.Now(), true, completed
		r.mu.Unlock()
	}
}

// relay forwards one request to the mock and streams its answer back, counting the bytes
// written in ex (when not nil); it says whether the whole answer was read and written. The
// mock's request does not carry the worker's context: a worker that closes its connection
// once it has [DONE] must not cut the mock's answer short of its EOF.
func (r *recorder) relay(w http.ResponseWriter, req *http.Request, path string, body []byte, ex *execution) bool {
	out, err := http.NewRequestWithContext(context.WithoutCancel(req.Context()), req.Method, r.mock+path, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return false
	}
	out.Header = req.Header.Clone()
	resp, err := r.client.Do(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return false
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	fl, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		m, rerr := resp.Body.Read(buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return false
			}
			if ex != nil {
				r.mu.Lock()
				ex.bytes += m
				r.mu.Unlock()
			}
			if fl != nil {
				fl.Flush()
			}
		}
		if rerr != nil {
			return errors.Is(rerr, io.EOF)
		}
	}
}

// of returns copies of the executions of intent.
func (r *recorder) of(intent string) []execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []execution
	for _, ex := range r.byIntent[intent] {
		out = append(out, *ex)
	}
	return out
}

// settled returns the executions of intent once none is in flight, or as they are after wait.
func (r *recorder) settled(intent string, wait time.Duration) []execution {
	deadline := time.Now().Add(wait)
	for {
		execs := r.of(intent)
		if !slices.ContainsFunc(execs, func(ex execution) bool { return !ex.ended }) || time.Now().After(deadline) {
			return execs
		}
		time.Sleep(pollEvery)
	}
}

// running returns the executions of worker slot still in flight that started at least
// minAge ago.
func (r *recorder) running(slot int, minAge time.Duration) []execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []execution
	for _, ex := range r.execs {
		if ex.worker == slot && !ex.ended && time.Since(ex.start) >= minAge {
			out = append(out, *ex)
		}
	}
	return out
}

// fault marks the executions worker slot is running as faulted (its process was just
// killed or paused) and returns their intents.
func (r *recorder) fault(slot int) map[string]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	hit := map[string]bool{}
	for _, ex := range r.execs {
		if ex.worker == slot && !ex.ended {
			ex.faulted = true
			hit[ex.intent] = true
		}
	}
	return hit
}

// String lists the executions (for failure messages).
func (r *recorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, ex := range r.execs {
		fmt.Fprintf(&b, "[worker %d %q %d bytes ended %v completed %v faulted %v] ", ex.worker, ex.intent, ex.bytes, ex.ended, ex.completed, ex.faulted)
	}
	return b.String()
}

func (r *recorder) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.execs)
}

// ---- the gateway processes ----

// gwNode is one oncegate serve process; a killed node is started again with the same args.
type gwNode struct {
	name string
	args []string
	base string // http://addr for an API node, "" for a worker
	// pprof is the process's Go profiler (serve --pprof), the same across restarts.
	pprof string
	p     *proc
}

// chaosEnv is one row's topology.
type chaosEnv struct {
	t       *testing.T
	rng     *rand.Rand
	bin     string
	dir     string
	cluster *testkit.Cluster // the in-process cluster (nil on nats-server processes)
	procs   *natsProcs       // the nats-server processes (nil in process)
	nats    chaosNATS        // whichever of the two runs
	natsURL string
	js      jetstream.JetStream // the harness's own view of the cluster
	mock    *proc
	mockURL string
	rec     *recorder
	apis    []*gwNode
	workers []*gwNode
	// baseConns is the cluster's client connection count once everything runs (I4).
	baseConns int
	// logSeen is how much of each process's log newErrorLines has read.
	logSeen map[*proc]int
	// settleI4 bounds waitSettled (chaosSettle unless a row's topology needs longer).
	settleI4 time.Duration
}

// chaosNATS is what the harness needs of a NATS cluster, in process (testkit.Cluster) or
// nats-server processes (natsProcs).
type chaosNATS interface {
	URLs() []string
	Connect(t testing.TB) (*nats.Conn, jetstream.JetStream)
	// ClientConns is the number of client connections the running servers hold (I4).
	ClientConns() (int, error)
}

// inProcNATS is the in-process cluster as a chaosNATS.
type inProcNATS struct{ *testkit.Cluster }

func (c inProcNATS) ClientConns() (int, error) {
	n := 0
	for i := range c.Size() {
		if s := c.Server(i); s != nil {
			n += s.NumClients()
		}
	}
	return n, nil
}

// chaosOption changes a row's topology.
type chaosOption func(*chaosEnv)

// onNATSProcs runs the row on three nats-server processes with the given JetStream
// sync_interval, instead of the in-process cluster.
func onNATSProcs(syncInterval string) chaosOption {
	return func(c *chaosEnv) {
		c.procs = runNATSProcs(c.t, syncInterval)
		c.nats = c.procs
		// A consumer whose inactivity delete was proposed while the meta leader changed is
		// deleted by the server's retry, 30-60 s later (consumer.go:2223,
		// defaultConsumerNotActiveStartInterval 30 s plus up to 30 s of jitter).
		c.settleI4 = chaosSettle + time.Minute
	}
}

// startChaos builds the topology for one row: the cluster, the mock process, the recorder,
// two API and two worker processes. row seeds the row's random choices.
func startChaos(t *testing.T, row string, opts ...chaosOption) *chaosEnv {
	t.Helper()
	if testing.Short() {
		t.Skip("the fault suite runs real processes")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool to build the binary")
	}
	var rowSeed uint64
	for _, b := range []byte(row) {
		rowSeed = rowSeed*131 + uint64(b)
	}
	c := &chaosEnv{t: t, rng: rand.New(rand.NewPCG(*chaosSeed, rowSeed)), bin: oncegateBinary(t), dir: t.TempDir(), settleI4: chaosSettle}
	for _, o := range opts {
		o(c)
	}
	if c.nats == nil {
		c.cluster = testkit.RunCluster(t, 3, chaosClusterOptions(row)...)
		c.nats = inProcNATS{c.cluster}
	}
	c.natsURL = strings.Join(c.nats.URLs(), ",")
	_, c.js = c.nats.Connect(t)

	mockAddr := testkit.FreeAddr(t)
	c.mock = startProc(t, "mock", c.bin, "mock", "--listen", mockAddr,
		"--inter-token", chaosInterToken.String(), "--tokens", "16")
	c.mockURL = "http://" + mockAddr
	testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
		if r := send(http.MethodGet, c.mockURL+"/stats", "", nil); r.Status != http.StatusOK {
			return fmt.Errorf("mock process not serving: %d %v", r.Status, r.Err)
		}
		return nil
	})
	c.rec = startRecorder(t, c.mockURL)

	for i := range 2 {
		cfg := c.writeConfig(fmt.Sprintf("worker%d", i), c.rec.workerBase(i))
		prof := testkit.FreeAddr(t)
		c.workers = append(c.workers, &gwNode{name: fmt.Sprintf("worker-%d", i), pprof: prof,
			args: []string{"serve", "--role", "worker", "--nats-url", c.natsURL, "--config", cfg, "--pprof", prof,
				"--data-dir", filepath.Join(c.dir, fmt.Sprintf("worker%d-data", i))}})
	}
	for i := range 2 {
		// API nodes never call a backend; their route still names one.
		cfg := c.writeConfig(fmt.Sprintf("api%d", i), c.rec.srv.URL+"/api/v1")
		addr, prof := testkit.FreeAddr(t), testkit.FreeAddr(t)
		c.apis = append(c.apis, &gwNode{name: fmt.Sprintf("api-%d", i), base: "http://" + addr, pprof: prof,
			args: []string{"serve", "--role", "api", "--nats-url", c.natsURL, "--config", cfg, "--listen", addr, "--pprof", prof,
				"--data-dir", filepath.Join(c.dir, fmt.Sprintf("api%d-data", i))}})
	}
	// One by one, each ready before the next: the first creates the replicated streams and
	// buckets, and on a freshly formed cluster with busy cores concurrent creations by four
	// processes have timed out (a start fails on the first error; it does not retry).
	for _, n := range append(slices.Clone(c.workers), c.apis...) {
		c.start(n)
	}
	// A first intent through each API node warms every process up (connections, consumers)
	// before the baseline is taken.
	// Short and side by side: a row's own intents are what it measures.
	var wg sync.WaitGroup
	for i, api := range c.apis {
		sp := c.newIntent(fmt.Sprintf("%s warm-up %d", row, i), 4)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := send(http.MethodPost, api.base+chatPath, sp.nsBody, sp.hdr())
			if r.Err != nil || r.Status != http.StatusOK || r.Header.Get("Oncegate-Idempotency") != "created" {
				t.Errorf("the warm-up through %s: %d %v %q", api.name, r.Status, r.Err, tail(r.Body))
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	c.waitSettled()
	if *chaosPartitions > 1 { // the processes run on the partitioned store: its last copy exists
		last := jobs.JobsStreamOf(partition.P(*chaosPartitions - 1))
		if _, err := c.js.Stream(context.Background(), last); err != nil {
			t.Fatalf("-chaos.partitions %d: stream %s: %v", *chaosPartitions, last, err)
		}
	}
	n, err := c.nats.ClientConns()
	if err != nil {
		t.Fatal(err)
	}
	c.baseConns = n
	return c
}

// chaosClusterOptions are row's cluster options: the flood and the soak (rows 10 and 18)
// run with nats-server's stock limits, so a consumer leak fails requests as on an operator's
// stock server (issue 12: 1,000 consumers per stream).
func chaosClusterOptions(row string) []testkit.ClusterOption {
	switch row {
	case "10":
		return []testkit.ClusterOption{testkit.StockLimits()}
	}
	return nil
}

// chaosDiscard overrides the processes' workers.discard_chunks_after (a diagnosis knob: the
// soak's CHUNKS purges).
var chaosDiscard = flag.String("chaos.discard-chunks", "", "workers.discard_chunks_after of the suite's processes (default: the gateway's)")

// chaosPartitions runs the suite's processes on a partitioned store (issue 45: rows 1, 2, 3a
// and 10 on two partitions, which share the three servers).
var chaosPartitions = flag.Int("chaos.partitions", 0, "nats.partitions of the suite's processes (default: the gateway's, one)")

func partitionsOverride() string {
	if *chaosPartitions == 0 {
		return ""
	}
	return fmt.Sprintf("nats: {partitions: %d}\n", *chaosPartitions)
}

func discardOverride() string {
	if *chaosDiscard == "" {
		return ""
	}
	return ", discard_chunks_after: " + *chaosDiscard
}

// writeConfig writes the config file of one process whose backend is at base.
func (c *chaosEnv) writeConfig(name, base string) string {
	c.t.Helper()
	// info: a worker says "workers started" once it runs (it serves no /readyz), and a
	// zombie says it was fenced.
	yaml := fmt.Sprintf(`log_level: info
idempotency: {lease: %s, renew_every: 500ms}
workers: {concurrency: 16, sweep_every: 1s%s}
backends:
  - {name: mockproc, type: openai, base_url: %q, models: [%s], timeout: 60s}
ledger:
  prices: {%s: {input_per_million: 1000000, output_per_million: 1000000}}
  reconcile_every: 1s
%s`, chaosLease, discardOverride(), base, config.MockModel, config.MockModel, partitionsOverride())
	path := filepath.Join(c.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return path
}

// start runs n's process and waits until it is ready: an API node's /readyz, a worker's
// "workers started" log line. A start that gave up on a NATS call timing out (the gateway's
// start does not retry: "jobs: ensure stream JOBS: context deadline exceeded" on a busy
// machine) is started again, at most twice, and said in the log.
func (c *chaosEnv) start(n *gwNode) {
	c.t.Helper()
	for try := 1; ; try++ {
		n.p = startProc(c.t, n.name, c.bin, n.args...)
		testkit.CheckFor(c.t, 30*time.Second, pollEvery, func() error {
			switch {
			case n.p.exited():
				return nil
			case n.base == "":
				if !strings.Contains(n.p.log.String(), "workers started") {
					return fmt.Errorf("%s has not started its workers", n.name)
				}
			default:
				if r := send(http.MethodGet, n.base+"/readyz", "", nil); r.Status != http.StatusOK {
					return fmt.Errorf("%s not ready: %d %v", n.name, r.Status, r.Err)
				}
			}
			return nil
		})
		if !n.p.exited() {
			return
		}
		log := n.p.log.String()
		if try == 3 || !strings.Contains(log, context.DeadlineExceeded.Error()) {
			c.t.Fatalf("%s exited: %v\n%s", n.name, n.p.err, log)
		}
		c.t.Logf("PRODUCT: %s's start gave up on a NATS timeout (try %d), starting it again: %s", n.name, try, strings.TrimSpace(log))
	}
}

func (c *chaosEnv) signal(n *gwNode, sig syscall.Signal) {
	c.t.Helper()
	if err := n.p.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("%v to %s: %v", sig, n.name, err)
	}
}

// chunkConsumers counts the consumers on CHUNKS: the API processes' tails (jobs.IsTail) and
// any other.
func (c *chaosEnv) chunkConsumers() (tails, others int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		return 0, 0, err
	}
	names := s.ConsumerNames(ctx)
	for n := range names.Name() {
		if jobs.IsTail(n) {
			tails++
		} else {
			others++
		}
	}
	return tails, others, names.Err()
}

// describeChunkConsumers says what the consumers on CHUNKS are: name, filter, created, last
// activity and where they live (what a consumer left behind is to be read with).
func (c *chaosEnv) describeChunkConsumers() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, jobs.ChunksStream)
	if err != nil {
		return err.Error()
	}
	var out []string
	infos := s.ListConsumers(ctx)
	for ci := range infos.Info() {
		where := ""
		if ci.Cluster != nil {
			where = ci.Cluster.Leader
		}
		out = append(out, fmt.Sprintf("%s (filter %s, created %s, last delivery %v, inactive threshold %s, leader %q)",
			ci.Name, ci.Config.FilterSubject, ci.Created.Format(time.RFC3339Nano), ci.Delivered.Last, ci.Config.InactiveThreshold, where))
	}
	if err := infos.Err(); err != nil {
		out = append(out, "listing: "+err.Error())
	}
	return strings.Join(out, "; ")
}

// waitSettled is I4: once nothing runs, CHUNKS holds no consumer but the API processes'
// tails, at most one each (a killed process's expires after its inactive threshold), and (after
// the first call) the cluster holds as many client connections as at the baseline.
func (c *chaosEnv) waitSettled() {
	c.t.Helper()
	testkit.CheckFor(c.t, c.settleI4, 50*time.Millisecond, func() error {
		tails, others, err := c.chunkConsumers()
		if err != nil {
			return err
		}
		if others != 0 || tails > len(c.apis) {
			return fmt.Errorf("I4: %d consumers on %s besides the tails, %d tails for %d API processes: %s",
				others, jobs.ChunksStream, tails, len(c.apis), c.describeChunkConsumers())
		}
		got, err := c.nats.ClientConns()
		if err != nil {
			return err
		}
		if c.baseConns != 0 && got != c.baseConns {
			return fmt.Errorf("I4: the cluster holds %d client connections, %d at the baseline", got, c.baseConns)
		}
		return nil
	})
}

// ---- intents and the clients' copies ----

// intentSpec is one intent: its key, its bodies (stream and not), its reference answer.
type intentSpec struct {
	key, msg     string
	tokens       int
	body, nsBody string
	want         string // the reference content (the mock asked directly)
	invoked      time.Time
	gen          time.Duration // the mock's own generation time
	mu           sync.Mutex
	copies       []*copyResult
	faultAt      time.Time // when this intent's trial injected its fault
}

func (c *chaosEnv) newIntent(msg string, tokens int) *intentSpec {
	c.t.Helper()
	knobs := fmt.Sprintf(`"mock":{"tokens":%d}`, tokens)
	sp := &intentSpec{key: "chaos-" + sha(msg)[:24], msg: msg, tokens: tokens,
		body: chatBody(config.MockModel, msg, `"stream":true,`+knobs), nsBody: chatBody(config.MockModel, msg, knobs),
		gen: time.Duration(tokens) * chaosInterToken}
	_, sp.want = reference(c.t, sp.nsBody)
	return sp
}

// seededIntent is an intent of the row with a seeded length (1-3 s of generation).
func (c *chaosEnv) seededIntent(row string, trial, i int) *intentSpec {
	return c.newIntent(fmt.Sprintf("chaos row %s trial %d intent %d seed %d", row, trial, i, *chaosSeed),
		chaosMinTokens+c.rng.IntN(chaosMaxTokens-chaosMinTokens+1))
}

func (sp *intentSpec) hdr() map[string]string {
	return map[string]string{"Idempotency-Key": sp.key, "Oncegate-Timeout": strconv.Itoa(int(chaosDeadline / time.Second))}
}

// attempt is one HTTP exchange of a copy.
type attempt struct {
	node       int
	status     int
	outcome    string
	retry      string // the x-should-retry header
	raw        []byte
	err        error
	start, end time.Time
	first      time.Time // the response's headers arrived (a stream's first event had)
}

// copyResult is one client's history for one intent (Jepsen-style: every exchange).
type copyResult struct {
	stream   bool
	attempts []attempt
	final    []byte // the body of the successful exchange (nil: none)
	invoked  time.Time
	done     time.Time
}

// ok says whether a is a complete answer: 200 and, for a stream, a [DONE] terminal event.
func (a attempt) ok(stream bool) bool {
	if a.err != nil || a.status != http.StatusOK {
		return false
	}
	if !stream {
		return true
	}
	st, err := parseChatStream(a.raw)
	return err == nil && st.Done
}

// streamHook lets a row act on a stream exchange as it is read: it is called after each
// event with the count so far, and returns true to close the connection (a client
// disconnect).
type streamHook func(events int) (disconnect bool)

// exchange sends one copy's request to node and reads its answer.
func (c *chaosEnv) exchange(sp *intentSpec, stream bool, node int, hook streamHook) (a attempt) {
	a = attempt{node: node, start: time.Now()}
	defer func() { a.end = time.Now() }()
	body := sp.nsBody
	if stream {
		body = sp.body
	}
	resp, err := openStream(http.MethodPost, c.apis[node].base+chatPath, body, sp.hdr())
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.first = time.Now()
	a.status, a.outcome, a.retry = resp.StatusCode, resp.Header.Get("Oncegate-Idempotency"), resp.Header.Get("x-should-retry")
	if !stream || resp.StatusCode != http.StatusOK {
		a.raw, a.err = io.ReadAll(resp.Body)
		return a
	}
	r := newSSEReader(resp.Body)
	for n := 1; ; n++ {
		if _, err := r.next(); err != nil {
			if !errors.Is(err, io.EOF) {
				a.err = err
			}
			break
		}
		if hook != nil && hook(n) {
			a.err = errDisconnected
			break
		}
	}
	a.raw = bytes.Clone(r.raw.Bytes())
	return a
}

// errDisconnected marks an exchange the client itself closed.
var errDisconnected = errors.New("client disconnected")

// runCopy is one client: it sends sp to node and, until it holds a complete answer or its
// deadline passes, retries with the same key on the other API node (a client's failover).
// hook acts on the first exchange only. Safe to call from any goroutine.
func (c *chaosEnv) runCopy(sp *intentSpec, stream bool, node int, hook streamHook) *copyResult {
	cr := &copyResult{stream: stream, invoked: time.Now()}
	deadline := cr.invoked.Add(chaosDeadline)
	for try := 0; time.Now().Before(deadline); try++ {
		a := c.exchange(sp, stream, node, hook)
		hook = nil
		cr.attempts = append(cr.attempts, a)
		if a.ok(stream) {
			cr.final, cr.done = a.raw, a.end
			break
		}
		node = 1 - node
		time.Sleep(time.Duration(min(try+1, 10)) * 20 * time.Millisecond) // the client's backoff
	}
	sp.mu.Lock()
	sp.copies = append(sp.copies, cr)
	sp.mu.Unlock()
	return cr
}

// ---- the invariants ----

// rowStats are one row's figures, the suite's table line.
type rowStats struct {
	row        string
	trials     int
	intents    int
	maxExec    int // completed backend executions per intent, max
	duplicates int // completed executions no takeover explains
	reexecuted int // completed executions after the first that a takeover explains
	aborted    int // backend executions that did not complete (ambiguous attempts)
	ackedLost  int
	maxCharges int // net charges per intent, max
	mismatches int // transcripts that differ from the others or are incomplete
	longestGap time.Duration
	reconnects []time.Duration // per client the fault cut off: first failure to first byte of its answer
	added      []time.Duration
	violations []string
}

func (s *rowStats) fail(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	s.violations = append(s.violations, msg)
	t.Error(msg)
}

// ambiguity is what a row allows: extra backend executions only where a takeover of the
// intent made the first one ambiguous.
type ambiguity int

const (
	noTakeover ambiguity = iota // the fault cannot touch the execution: exactly one, no takeover
	takeoverOK                  // a worker fault: takeovers allowed, each may add one execution
)

// checkIntent checks I1, I3 and I5 for one intent once its copies are done, and adds its
// figures to s.
func (c *chaosEnv) checkIntent(s *rowStats, sp *intentSpec, amb ambiguity) (jobID string) {
	t := c.t
	t.Helper()
	s.intents++
	// I5: the record is terminal, within the intent's deadline.
	var st map[string]any
	testkit.CheckFor(t, chaosSettle, pollEvery, func() error {
		if st = idemStatus(t, c.apis[0].base, sp.key, nil); st["state"] == "PENDING" {
			return fmt.Errorf("I5: intent %q still PENDING: %v", sp.key, st)
		}
		return nil
	})
	jobID, _ = st["job_id"].(string)
	created, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(st["created"]))
	finished, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(st["finished"]))
	if st["state"] != "COMPLETED" {
		s.fail(t, "I5: intent %q ended %v, want COMPLETED", sp.key, st)
	} else if finished.Sub(created) > chaosDeadline {
		s.fail(t, "I5: intent %q finished %s after it was created, past its %s deadline", sp.key, finished.Sub(created), chaosDeadline)
	}
	takeovers := 0
	if v, ok := st["takeovers"].(float64); ok {
		takeovers = int(v)
	}

	// I1: one completed backend execution; others only where a takeover made one ambiguous.
	// A call the fault hit is an aborted (ambiguous) attempt even if the mock finished it.
	// A taken-over epoch's execution, cut off from NATS by the fault, can still be in its
	// backend call when a later epoch's outcome is stored (row 3b saw it): it is counted once
	// it ended, completed or aborted, not judged mid-call.
	execs := c.rec.settled(sp.msg, chaosSettle)
	completed, aborted := 0, 0
	for _, ex := range execs {
		switch {
		case !ex.ended:
			s.fail(t, "I1: intent %q: a backend execution by worker %d is still running", sp.key, ex.worker)
		case ex.completed && !ex.faulted:
			completed++
		default:
			aborted++
		}
	}
	s.maxExec = max(s.maxExec, completed)
	s.reexecuted += max(0, completed-1)
	if completed > 1 {
		t.Logf("intent %q (job %s): %d completed executions, %d takeovers", sp.key, st["job_id"], completed, takeovers)
	}
	s.aborted += aborted
	allowed := 1
	if amb == takeoverOK {
		allowed += takeovers
	} else if takeovers != 0 || aborted != 0 {
		s.fail(t, "I1: intent %q: %d takeovers, %d aborted executions; this fault must not touch the execution", sp.key, takeovers, aborted)
	}
	if completed > allowed {
		s.duplicates += completed - allowed
		s.fail(t, "I1: intent %q: %d completed backend executions, %d takeovers: duplicates", sp.key, completed, takeovers)
	}
	if completed == 0 {
		s.fail(t, "I1: intent %q: no completed backend execution", sp.key)
	}
	if len(execs) > 1+takeovers {
		s.fail(t, "I1: intent %q: %d backend executions, only %d takeovers explain extra ones", sp.key, len(execs), takeovers)
	}

	// I3: every client holds the complete answer; the stream copies byte-identical, the
	// non-stream copies byte-identical; a same-key replay on each node equals them too (an
	// acknowledged answer is never lost).
	var streams, plains [][]byte
	for _, cr := range sp.copies {
		for _, a := range cr.attempts {
			if err := c.checkPartial(a, cr.stream, sp.want); err != nil {
				s.mismatches++
				s.fail(t, "I3: intent %q, an exchange on %s: %v", sp.key, c.apis[a.node].name, err)
			}
		}
		if cr.final == nil {
			s.mismatches++
			s.fail(t, "I3: intent %q: a client (stream %v) got no complete answer within its deadline: %d exchanges, last %s; the record: job %s, epoch %v, %v takeovers, created %s, finished %s",
				sp.key, cr.stream, len(cr.attempts), describe(cr.attempts[len(cr.attempts)-1]), jobID, st["epoch"], st["takeovers"],
				created.Format(time.RFC3339Nano), finished.Format(time.RFC3339Nano))
			continue
		}
		if cr.stream {
			streams = append(streams, withoutComments(cr.final))
		} else {
			plains = append(plains, cr.final)
		}
		if !sp.faultAt.IsZero() && cr.done.After(sp.faultAt) && len(cr.attempts) > 1 {
			s.longestGap = max(s.longestGap, cr.done.Sub(sp.faultAt))
			// A client the fault cut off: from its failed exchange to its answer's first byte.
			s.reconnects = append(s.reconnects, cr.attempts[len(cr.attempts)-1].first.Sub(cr.attempts[0].end))
		}
		s.added = append(s.added, cr.done.Sub(cr.invoked)-sp.gen)
	}
	for i, api := range c.apis {
		for _, stream := range []bool{true, false} {
			a := c.exchange(sp, stream, i, nil)
			if !a.ok(stream) || a.outcome != "replayed" {
				s.ackedLost++
				s.fail(t, "I3: intent %q: the replay on %s: %s", sp.key, api.name, describe(a))
				continue
			}
			if stream {
				streams = append(streams, withoutComments(a.raw))
			} else {
				plains = append(plains, a.raw)
			}
		}
	}
	for _, set := range [][][]byte{streams, plains} {
		if len(set) == 0 {
			continue // no complete answer of this kind: failed above
		}
		for _, b := range set[1:] {
			if !bytes.Equal(b, set[0]) { // streams are without their heartbeats already
				s.mismatches++
				s.fail(t, "I3: intent %q: transcripts differ %s", sp.key, firstDiff(b, set[0]))
			}
		}
	}
	if len(streams) > 0 {
		if st, err := parseChatStream(streams[0]); err != nil || st.Content != sp.want || !st.Done {
			s.mismatches++
			s.fail(t, "I3: intent %q: the stream transcript is not the backend's answer (%v): %q", sp.key, err, tail(streams[0]))
		}
	}
	if len(plains) > 0 {
		if _, content, err := answerOf(plains[0]); err != nil || content != sp.want {
			s.mismatches++
			s.fail(t, "I3: intent %q: the answer is not the backend's (%v): %q", sp.key, err, tail(plains[0]))
		}
	}
	return jobID
}

// firstDiff shows where a and b first differ, with some bytes around it.
func firstDiff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-150)
	return fmt.Sprintf("at byte %d of %d and %d:\n%q\n%q", i, len(a), len(b), a[from:min(len(a), i+150)], b[from:min(len(b), i+150)])
}

// checkPartial is I3 for an exchange that may have been cut by the fault: what it holds is
// part of the one answer (never a splice of two executions), and a stream that the server
// ended (not the fault, not the client) ends with an explicit terminal event.
func (c *chaosEnv) checkPartial(a attempt, stream bool, want string) error {
	if a.status == 0 {
		return nil // no response at all: the node was down
	}
	if a.status != http.StatusOK {
		return nil // a refusal the client retried (5xx with a reason): no output to check
	}
	if !stream {
		if a.err != nil {
			return nil
		}
		if _, content, err := answerOf(a.raw); err != nil || content != want {
			return fmt.Errorf("a 200 that is not the answer (%v): %q", err, tail(a.raw))
		}
		return nil
	}
	evs, err := sseEvents(trimPartialEvent(a.raw))
	if err != nil {
		return fmt.Errorf("not an event stream: %v", err)
	}
	data := make([]string, len(evs))
	for i, ev := range evs {
		data[i] = ev.Data
	}
	st, err := chatTranscript(data)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(want, st.Content) {
		return fmt.Errorf("content %q is not a prefix of the answer %q: a splice", st.Content, want)
	}
	if a.err == nil && !st.Done && st.ErrCode == "" {
		return fmt.Errorf("the stream ended with no terminal event: %q", tail(a.raw))
	}
	return nil
}

// withoutComments is an SSE body without its comment-only blocks: the heartbeat (": ping")
// the gateway sends while a stream waits 5 s for its next chunk (a stall in a fault) is no
// part of the transcript.
func withoutComments(raw []byte) []byte {
	var out []byte
	for _, block := range bytes.SplitAfter(raw, []byte("\n\n")) {
		comment := len(block) > 0
		for _, line := range bytes.Split(bytes.TrimRight(block, "\n"), []byte("\n")) {
			comment = comment && bytes.HasPrefix(line, []byte(":"))
		}
		if !comment {
			out = append(out, block...)
		}
	}
	return out
}

// trimPartialEvent drops an event cut off by a broken connection (after the last blank line).
func trimPartialEvent(raw []byte) []byte {
	if i := bytes.LastIndex(raw, []byte("\n\n")); i >= 0 {
		return raw[:i+2]
	}
	return nil
}

func describe(a attempt) string {
	return fmt.Sprintf("status %d outcome %q err %v body %q", a.status, a.outcome, a.err, tail(a.raw))
}

// checkLedger is I2 for the row's intents (their job ids): the chain verifies, and after the
// reconciler each intent nets to one charge, the one of its completed execution.
func (c *chaosEnv) checkLedger(s *rowStats, jobIDs []string) {
	t := c.t
	t.Helper()
	var last error
	testkit.CheckFor(t, chaosSettle, 200*time.Millisecond, func() error {
		out, err := c.ledgerCmd("export", "--format", "jsonl")
		if err != nil {
			return err
		}
		type net struct {
			charges, completed  int
			cost, completedCost int64
		}
		per := map[string]*net{}
		for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var e struct {
				Kind       string `json:"kind"`
				JobID      string `json:"job_id"`
				Completed  bool   `json:"completed"`
				CostMicros int64  `json:"cost_micros"`
				Refers     string `json:"refers"`
			}
			if err := json.Unmarshal(line, &e); err != nil {
				return fmt.Errorf("ledger export line %q: %v", line, err)
			}
			n := per[e.JobID]
			if n == nil {
				n = &net{}
				per[e.JobID] = n
			}
			if e.Kind == "reversal" {
				n.charges--
				n.cost -= e.CostMicros
				continue
			}
			n.charges++
			n.cost += e.CostMicros
			if e.Completed {
				n.completed++
				n.completedCost += e.CostMicros
			}
		}
		worst := 0
		for _, id := range jobIDs {
			n := per[id]
			if n == nil {
				return fmt.Errorf("I2: job %s has no charge", id)
			}
			worst = max(worst, n.charges)
			if n.charges != 1 || n.completed != 1 || n.cost != n.completedCost || n.cost <= 0 {
				last = fmt.Errorf("I2: job %s nets to %d charges, %d micros, %d completed charges of %d micros; want one charge, that of its completed execution",
					id, n.charges, n.cost, n.completed, n.completedCost)
				return last
			}
		}
		s.maxCharges = max(s.maxCharges, worst)
		last = nil
		return nil
	})
	if out, err := c.ledgerCmd("verify"); err != nil {
		s.fail(t, "I2: ledger verify against the cluster: %v\n%s", err, out)
	}
}

// ledgerCmd runs `oncegate ledger SUB … --nats-url <the cluster>`.
func (c *chaosEnv) ledgerCmd(sub string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append(append([]string{"ledger", sub}, args...), "--nats-url", c.natsURL)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + c.dir}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("oncegate ledger %s: %w: %s", sub, err, stderr.Bytes())
	}
	return out, nil
}

// finishRow checks what holds for the whole row: I2 over its intents, I4, and the mock's own
// count against the recorder's.
func (c *chaosEnv) finishRow(s *rowStats, jobIDs []string) {
	c.t.Helper()
	c.checkLedger(s, jobIDs)
	c.waitSettled()
	var ms struct {
		Requests int `json:"requests"`
	}
	r := send(http.MethodGet, c.mockURL+"/stats", "", nil)
	if err := json.Unmarshal(r.Body, &ms); err != nil || ms.Requests != c.rec.total() {
		s.fail(c.t, "the mock process counted %d requests (%v), the recorder %d", ms.Requests, err, c.rec.total())
	}
	s.log(c.t)
}

func (s *rowStats) log(t *testing.T) {
	t.Helper()
	if len(s.reconnects) > 0 {
		t.Logf("row %s: clients cut off by the fault, from the failed exchange to the first byte of the answer on a retry: p50 %s p99 %s max %s over %d clients",
			s.row, percentile(s.reconnects, 50), percentile(s.reconnects, 99), percentile(s.reconnects, 100), len(s.reconnects))
	}
	t.Logf("CHAOS %s", s.line())
}

func (s *rowStats) line() string {
	return fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s | %d |", s.row, s.trials, s.maxExec, s.duplicates, s.reexecuted,
		s.ackedLost, s.maxCharges, s.mismatches, s.aborted, s.longestGap.Round(time.Millisecond), percentile(s.added, 99), len(s.violations))
}

const chaosTableHeader = "| row | trials | executions per intent (max) | duplicates | re-executed after a takeover | acknowledged answers lost | charges per intent (max) | transcript mismatches | aborted attempts | longest time without a successful answer | p99 added latency | violations |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|"
