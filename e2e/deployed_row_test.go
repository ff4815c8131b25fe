package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/lb"
)

// The fault row a user's deployment would recognise (issue 34): the three cluster
// nodes of docs/operations/cluster.md as built binaries, a load balancer in front (round robin, retry on connect errors
// only), a population of clients using the official Go SDK with its default retry policy
// (two retries, backoff with jitter, x-stainless-retry-count, Retry-After) and a 1 s
// per-attempt timeout, a node killed -9 every period and restarted 5 s later. The intents:
// keyed (a key each), keyless (the auto key), and bypassed (X-Allow-Duplicate); 5 % of the
// generations outlast the SDK's timeout (its retry must join them), 2 % of the keyless ones
// are sent again on purpose 5-8 s later (a new intent: the auto window is 3 s), 2 % are sent
// twice at the same moment (one intent when keyless; two executions when bypassed).
//
// Per run it reports duplicate executions by kind (beyond what the intents ask for, on
// executions no kill cut), executions cut by a kill, false merges (two intents answered by one
// job), the share answered within the SDK's three attempts, p99 time to answer, and the
// ledger's standing charges against the jobs answered. Short in `go test ./...` (240 intents,
// one kill); -deployed.intents and -deployed.kill_every (or -chaos.long: 10,000 intents, a
// kill every 60 s) make the long run whose table RELIABILITY.md keeps.
var (
	deployedIntents   = flag.Int("deployed.intents", 0, "intents in TestDeployedRow (default 240, 10,000 with -chaos.long)")
	deployedKillEvery = flag.Duration("deployed.kill_every", 0, "a node killed every this long in TestDeployedRow (default 10 s, 60 s with -chaos.long)")
	// Issue 43 item 2 measures the row with 10 s clients (the per-attempt timeout of a client
	// that waits through an election).
	deployedTimeout = flag.Duration("deployed.timeout", time.Second, "the SDK clients' per-attempt timeout in TestDeployedRow")
	// The Go SDK states its timeout (X-Stainless-Timeout) only for its own request timeout,
	// which it does not retry; the Node SDK states it for the timeout it retries.
	deployedRate    = flag.Int("deployed.rate", 10, "intents TestDeployedRow starts per second")
	deployedNoFault = flag.Bool("deployed.nofault", false, "TestDeployedRow kills no node: the no-fault control, which must answer at least 99.9 % of calls within the SDK's attempts (issue 44)")
	deployedStated  = flag.Bool("deployed.stated", false, "TestDeployedRow's clients state their timeout in X-Stainless-Timeout, as the Node SDK does")
	// deployedPartitions runs the row on 3·N nodes, N partitions each placed on its own three
	// (issue 45: P=2 on six nodes).
	deployedPartitions = flag.Int("deployed.partitions", 0, "TestDeployedRow on 3·N nodes with N partitions, each on its own three (docs/operations/cluster.md's partitions section)")
)

// deployedKind is what an intent of the population is.
type deployedKind string

const (
	kindKeyed   deployedKind = "keyed"
	kindKeyless deployedKind = "keyless"
	kindBypass  deployedKind = "bypass"
)

// deployedCall is one SDK call (with its retries) and what it got.
type deployedCall struct {
	content string
	kind    deployedKind
	key     string
	err     error
	took    time.Duration
	jobID   string
}

// deployedGroup is the calls that share a content and the executions they ask for.
type deployedGroup struct {
	kind  deployedKind
	calls []*deployedCall
	want  int // executions the intents of this content ask for
	// distinct: every call is an intent of its own (no two may share a job).
	distinct    bool
	slow        bool          // a generation that outlasts the SDK's per-attempt timeout
	repeatAfter time.Duration // > 0: the second call is sent this long after the first
}

func TestDeployedRow(t *testing.T) {
	t.Parallel() // built binaries on ports of their own; mostly waiting on its clients
	if testing.Short() {
		t.Skip("runs the three-node cluster of docs/operations/cluster.md as built binaries")
	}
	intents, killEvery := 240, 10*time.Second
	if *chaosLong {
		intents, killEvery = 10_000, time.Minute
	}
	if *deployedIntents > 0 {
		intents = *deployedIntents
	}
	if *deployedKillEvery > 0 {
		killEvery = *deployedKillEvery
	}
	const model = "gpt-lb"
	bin := oncegateBinary(t)
	mockAddr, _ := startMockProc(t, bin, "--models", model)
	rec := startRecorder(t, "http://"+mockAddr)
	nodes := readmeClusterNodes(t)
	if *deployedPartitions > 1 {
		nodes = partitionedNodes(t, nodes, *deployedPartitions)
	}
	var addrs []string
	start := func(i int) {
		// The user's own backend, as docs/backends.md says to add one (OPENAI_BASE_URL): every
		// node's calls go through the recorder under its own slot, so a kill knows which
		// calls it cut.
		n := nodes[i]
		env := []string{"OPENAI_BASE_URL=" + rec.workerBase(i), "OPENAI_API_KEY=unused"}
		n.p = startProcEnv(t, n.name, env, bin, n.args...)
	}
	for i, n := range nodes {
		start(i)
		addrs = append(addrs, strings.TrimPrefix(n.base, "http://"))
	}
	waitClusterReady(t, nodes)
	bal := lb.Start(t, addrs...)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var kills sync.WaitGroup
	killed := 0
	kills.Add(1)
	go func() { // the fault: a node killed every killEvery, restarted 5 s later
		defer kills.Done()
		for i := 0; !*deployedNoFault; i++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(killEvery):
			}
			nodes[i%len(nodes)].p.kill(t)
			rec.fault(i % len(nodes))
			killed++
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			start(i % len(nodes))
		}
	}()

	// The per-attempt timeout is the HTTP client's: the Go SDK retries it as a transport error,
	// as the Python and Node SDKs retry their own timeout (its option.WithRequestTimeout is
	// returned at once, see TestSDKRetriesWithoutKey).
	client := openai.NewClient(option.WithBaseURL(bal.URL()+"/v1"), option.WithAPIKey("unused"),
		option.WithHTTPClient(&http.Client{Timeout: *deployedTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}))
	call := func(c *deployedCall, slow bool) { // one SDK call, its retries included
		knobs := `{"tokens":3,"inter_token_ms":10}`
		if slow { // 1.6 s: past the SDK's 1 s timeout, so its retries must join it
			knobs = `{"tokens":16,"inter_token_ms":100}`
		}
		opts := []option.RequestOption{option.WithJSONSet("mock", json.RawMessage(knobs))}
		if *deployedStated {
			opts = append(opts, option.WithHeader("X-Stainless-Timeout", strconv.Itoa(int(deployedTimeout.Seconds()))))
		}
		switch c.kind {
		case kindKeyed:
			opts = append(opts, option.WithHeader("Idempotency-Key", c.key))
		case kindBypass:
			opts = append(opts, option.WithHeader("X-Allow-Duplicate", "true"))
		}
		var resp *http.Response
		opts = append(opts, option.WithResponseInto(&resp))
		start := time.Now()
		_, c.err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(c.content)}}, opts...)
		c.took = time.Since(start)
		if c.err == nil && resp != nil {
			c.jobID = resp.Header.Get("Oncegate-Job-Id")
		}
	}

	rng := rand.New(rand.NewPCG(34, 10_000)) // #nosec G404 -- the population's mix, reproducible
	run := fmt.Sprintf("%d", time.Now().UnixNano())
	groups := make([]*deployedGroup, intents)
	began := time.Now()
	var wg sync.WaitGroup
	work := make(chan int)
	for range 24 * max(1, *deployedRate/10) { // the callers a rate needs, 1.6 s slow calls included
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				g := groups[i]
				if g.repeatAfter > 0 { // the same content again, on purpose, past the auto window
					call(g.calls[0], g.slow)
					time.Sleep(g.repeatAfter)
					call(g.calls[1], g.slow)
					continue
				}
				var same sync.WaitGroup // one call, or two at the same moment
				for _, c := range g.calls {
					same.Add(1)
					go func() { defer same.Done(); call(c, g.slow) }()
				}
				same.Wait()
			}
		}()
	}
	for i := range intents {
		content := fmt.Sprintf("deployed %s intent %d", run, i)
		g := &deployedGroup{want: 1, slow: i%20 == 7}
		switch r := i % 10; {
		case r < 4:
			g.kind = kindKeyed
		case r < 9:
			g.kind = kindKeyless
		default:
			g.kind = kindBypass
		}
		n := 1
		switch p := rng.IntN(100); {
		case p < 2: // the same content twice at the same moment
			n = 2
			if g.kind == kindBypass {
				g.want, g.distinct = 2, true
			}
		case p < 4 && g.kind == kindKeyless: // sent again on purpose, past the auto window
			n, g.want, g.distinct = 2, 2, true
			g.repeatAfter = 5*time.Second + time.Duration(rng.IntN(3000))*time.Millisecond
		}
		for range n {
			g.calls = append(g.calls, &deployedCall{content: content, kind: g.kind, key: content})
		}
		groups[i] = g
		// Paced, so that the population spans the kills: 10 intents a second by default.
		time.Sleep(time.Until(began.Add(time.Duration(i) * time.Second / time.Duration(*deployedRate))))
		work <- i
	}
	close(work)
	wg.Wait()
	cancel()
	kills.Wait()
	waitClusterReady(t, nodes) // a node restarted at the end: the ledger is read from all
	reportDeployedRow(t, rec, groups, killed, nodes, bin)
}

// reportDeployedRow checks and prints the row's figures.
func reportDeployedRow(t *testing.T, rec *recorder, groups []*deployedGroup, killed int, nodes []*clusterNode, bin string) {
	t.Helper()
	dups := map[deployedKind]int{}
	var cut, falseMerges, retryMerges, calls, answered int
	var took []time.Duration
	jobs := map[string]bool{}
	for _, g := range groups {
		var whole int
		for _, ex := range rec.of(g.calls[0].content) {
			if ex.faulted {
				cut++
			} else {
				whole++
			}
		}
		if whole > g.want {
			dups[g.kind] += whole - g.want
			t.Logf("%s %q: %d executions no kill cut, want %d: %s", g.kind, g.calls[0].content, whole, g.want, describeGroup(rec, g))
		}
		seen := map[string]int{}
		for _, c := range g.calls {
			calls++
			if c.err != nil {
				if calls-answered <= 20 {
					t.Logf("%s call %q (slow %v) failed after %s: %v", c.kind, c.content, g.slow, c.took.Round(time.Millisecond), c.err)
				}
				continue
			}
			answered++
			took = append(took, c.took)
			jobs[c.jobID] = true
			seen[c.jobID]++
		}
		if g.distinct {
			for _, n := range seen {
				if n < 2 {
					continue
				}
				// Known, not fixed (issue 34's closing note): a keyless repeat whose own
				// attempt timed out in an election, and whose retry (a declared SDK retry,
				// which matches the latest identical request for the whole TTL) found the
				// earlier intent's record before its attempt's reclaim landed. Counted apart
				// and reported; any other merge fails the row.
				if g.kind == kindKeyless && g.repeatAfter > 0 && g.calls[1].took >= time.Second {
					retryMerges += n - 1
				} else {
					falseMerges += n - 1
				}
				t.Logf("%s %q: %d intents answered by one job: %s", g.kind, g.calls[0].content, n, describeGroup(rec, g))
			}
		}
	}
	slices.Sort(took)
	p99 := time.Duration(0)
	if len(took) > 0 {
		p99 = took[min(len(took)-1, len(took)*99/100)]
	}
	standing := deployedStandingCharges(t, bin, nodes)
	var charged, multi int
	for job := range jobs {
		if standing[job] > 0 {
			charged++
		}
		if standing[job] > 1 {
			multi++
		}
	}
	t.Logf("DEPLOYED ROW | %d intents, %d calls, %d kills | duplicate executions: keyed %d, keyless %d, bypass %d | cut by a kill %d | false merges %d (and %d repeats answered by the earlier intent through a retry) | answered %.2f %% | p99 %s | jobs answered %d, with a standing charge %d, with more than one %d",
		len(groups), calls, killed, dups[kindKeyed], dups[kindKeyless], dups[kindBypass], cut, falseMerges, retryMerges,
		100*float64(answered)/float64(max(calls, 1)), p99.Round(time.Millisecond), len(jobs), charged, multi)
	// Always: no job billed twice once reconciled, and the fault happened. (A job answered by
	// a worker killed before its charge is charged by the sweep within 35 s: not awaited.)
	if multi != 0 {
		t.Errorf("%d of %d answered jobs charged more than once after reconcile", multi, len(jobs))
	}
	switch share := float64(answered) / float64(max(calls, 1)); {
	case *deployedNoFault && share < 0.999:
		t.Errorf("the no-fault control answered %.2f %% of calls within the SDK's attempts, want at least 99.9 %%", 100*share)
	case !*deployedNoFault && killed == 0:
		t.Error("no node was killed: the run ended before the first kill")
	}
	// The goal (0 duplicate executions no kill cut, 0 false merges) is checked by the
	// long run, where it is the figure RELIABILITY.md reports; it is not met yet (issue 34's
	// note: 13 duplicates and 1 false merge per 10,000 intents with 15 kills). The short run
	// reports them: at 240 intents a failure of it would be noise, not a signal.
	if long := len(groups) >= 1000; long {
		if n := dups[kindKeyed] + dups[kindKeyless] + dups[kindBypass]; n != 0 {
			t.Errorf("%d duplicate executions no kill cut", n)
		}
		if falseMerges != 0 {
			t.Errorf("%d false merges", falseMerges)
		}
	}
}

// deployedStandingCharges reconciles the cluster's ledger (`oncegate ledger reconcile`, as an
// operator runs it) and counts each job's charges that stand (not reversed) in its export.
func deployedStandingCharges(t *testing.T, bin string, nodes []*clusterNode) map[string]int {
	t.Helper()
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.natsURL
	}
	url := strings.Join(urls, ",")
	if out, err := exec.Command(bin, "ledger", "reconcile", "--nats-url", url).CombinedOutput(); err != nil {
		t.Fatalf("ledger reconcile: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "ledger", "export", "--nats-url", url).Output()
	if err != nil {
		t.Fatalf("ledger export: %v", err)
	}
	type entry struct {
		ID     string `json:"id"`
		Kind   string `json:"kind"`
		JobID  string `json:"job_id"`
		Refers string `json:"refers"`
	}
	var es []entry
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("export line %q: %v", sc.Text(), err)
		}
		es = append(es, e)
	}
	reversed := map[string]bool{}
	for _, e := range es {
		if e.Kind == "reversal" {
			reversed[e.Refers] = true
		}
	}
	t.Logf("ledger: %d entries, %d reversed", len(es), len(reversed))
	standing := map[string]int{}
	for _, e := range es {
		if e.Kind == "charge" && !reversed[e.ID] {
			standing[e.JobID]++
		}
	}
	return standing
}

// describeGroup says what a group's calls got and which executions its content had (for a
// failure's log).
func describeGroup(rec *recorder, g *deployedGroup) string {
	var b strings.Builder
	for _, c := range g.calls {
		fmt.Fprintf(&b, "[call job %s took %s err %v] ", c.jobID, c.took.Round(time.Millisecond), c.err)
	}
	for _, ex := range rec.of(g.calls[0].content) {
		fmt.Fprintf(&b, "[node %d at %s for %s completed %v faulted %v] ", ex.worker+1, ex.start.Format("15:04:05.000"),
			ex.end.Sub(ex.start).Round(time.Millisecond), ex.completed, ex.faulted)
	}
	return b.String()
}

// partitionedNodes is the page's three nodes and 3·(parts-1) more like them (fresh ports and
// data directories), every one routed to all, with parts partitions, partition k's streams on
// nodes 3k to 3k+2 (placement tags og-p<k>).
func partitionedNodes(t *testing.T, page []*clusterNode, parts int) []*clusterNode {
	t.Helper()
	host, _ := os.Hostname()
	dir := t.TempDir()
	nodes := slices.Clone(page)
	for i := len(page); i < 3*parts; i++ {
		args := slices.Clone(page[i%len(page)].args)
		listen, natsListen, clusterListen := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
		setFlag(t, args, "--listen", listen)
		setFlag(t, args, "--nats-listen", natsListen)
		setFlag(t, args, "--nats-cluster-listen", clusterListen)
		setFlag(t, args, "--data-dir", filepath.Join(dir, fmt.Sprintf("n%d", i+1)))
		_, routePort, _ := net.SplitHostPort(clusterListen)
		nodes = append(nodes, &clusterNode{name: fmt.Sprintf("node %d", i+1), args: args, base: "http://" + listen,
			natsURL: "nats://" + natsListen, serverName: host + "-" + routePort})
	}
	var routes []string
	for _, n := range nodes {
		routes = append(routes, "nats://"+flagValue(t, n.args, "--nats-cluster-listen"))
	}
	for i, n := range nodes {
		setFlag(t, n.args, "--nats-routes", strings.Join(routes, ","))
		n.args = append(n.args, "--nats-partitions", strconv.Itoa(parts), "--nats-place-partitions",
			"--nats-tags", partition.P(i/3).Tag())
	}
	return nodes
}

// setFlag sets the value of flag in args, which must have it.
func setFlag(t *testing.T, args []string, flag, value string) {
	t.Helper()
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			args[i+1] = value
			return
		}
	}
	t.Fatalf("no %s in %v", flag, args)
}
