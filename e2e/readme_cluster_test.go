package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// clusterNode is one node of the cluster of docs/operations/cluster.md as this test runs it.
type clusterNode struct {
	name       string
	args       []string
	p          *proc
	base       string // http://host:port
	natsURL    string // its --nats-listen
	serverName string // its JetStream peer name, <hostname>-<route port>
}

// TestReadmeCluster runs exactly the commands of docs/operations/cluster.md's first sh block
// (it was the README's "Cluster" section): the binary is built once (the page's
// `go build -o oncegate ./cmd/oncegate` is the
// package's oncegateBinary), and the three `./oncegate serve ...` commands run as three
// processes of it, with every 127.0.0.1 port they name replaced by a free port (the same free
// port wherever the page repeats it, so the routes still name the route ports) and each
// ./data/... directory by a temporary one. Nothing else is changed.
//
// Every node must log that it set up its streams and buckets with 3 replicas (the page's
// promise: three nodes survive the loss of one). It waits for all three /readyz, sends one
// intent (one Idempotency-Key) to node 1, then to node 2 and node 3: one backend execution
// across the cluster (the workers' lifetime request counts on the shared status board, read
// after every worker posted again) and one body. Then it SIGKILLs the node whose embedded
// server leads KV_IDEM (the stream every keyed request claims in) and shows that the two
// survivors answer a new intent within an election's time (survivorBound), and from then on
// answer new intents and replay the earlier one, never `503 store_unavailable`.
//
// With the page's own ports the nodes chose 1 replica before: node 1's client port,
// 127.0.0.1:4222, is the NATS client's default URL, so no in-process client counted it among
// the servers it had discovered. Free ports hide that cause (ONCEGATE_E2E_README_PORTS=1 keeps
// the page's); gateway's TestEmbeddedClusterPicksThreeReplicas shows it on any port.
func TestReadmeCluster(t *testing.T) {
	t.Parallel() // processes and ports of its own; mostly waiting (CI's e2e time, issue 34)
	start := time.Now()
	nodes := readmeClusterNodes(t)
	for _, n := range nodes {
		n.start(t)
	}
	waitClusterReady(t, nodes)
	t.Logf("three nodes ready in %s", time.Since(start).Round(time.Millisecond))
	for _, n := range nodes {
		if got := n.loggedReplicas(t); got != 3 {
			t.Errorf("%s set its streams and buckets up with %d replicas, want 3: losing one node would lose them", n.name, got)
		}
	}

	// One intent through all three nodes.
	body := chatBody("oncegate-mock", "one intent, three nodes", "")
	hdr := map[string]string{"Idempotency-Key": "readme-cluster-1"}
	var first result
	for i, n := range nodes {
		r := postChat(t, n.base, body, hdr)
		if r.Status != http.StatusOK {
			t.Fatalf("node %d: %d %s", i+1, r.Status, r.Body)
		}
		if i == 0 {
			first = r
			continue
		}
		if string(r.Body) != string(first.Body) {
			t.Errorf("node %d answered another body:\n%s\nnode 1:\n%s", i+1, r.Body, first.Body)
		}
		if o := r.Header.Get("Oncegate-Idempotency"); o != "replayed" {
			t.Errorf("node %d: Oncegate-Idempotency %q, want replayed", i+1, o)
		}
	}
	if calls := backendCalls(t, nodes[0].base, len(nodes), first.End); calls != 1 {
		t.Fatalf("the cluster's workers made %d backend calls for one intent, want 1", calls)
	}

	t.Run("SIGKILL of the KV_IDEM leader keeps a quorum", func(t *testing.T) {
		victim := streamLeader(t, nodes, "KV_IDEM")
		t.Logf("SIGKILL %s (%s), the KV_IDEM leader", nodes[victim].name, nodes[victim].serverName)
		nodes[victim].p.kill(t)
		killed := time.Now()
		var alive []*clusterNode
		for i, n := range nodes {
			if i != victim {
				alive = append(alive, n)
			}
		}
		// A new intent on each survivor, its key retried (safe: one intent) until it is
		// answered, which may take leader elections.
		for i, n := range alive {
			body := chatBody("oncegate-mock", fmt.Sprintf("after a node is gone, %d", i), "")
			key := fmt.Sprintf("readme-cluster-after-%d", i)
			var last result
			for {
				if last = postBriefly(n.base, body, key); last.Status == http.StatusOK {
					break
				}
				if time.Since(killed) > survivorBound {
					t.Fatalf("%s did not answer a new intent within %s of the kill: last %d %v %s", n.name, survivorBound, last.Status, last.Err, last.Body)
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("%s answered a new intent %s after the kill", n.name, time.Since(killed).Round(time.Millisecond))
		}
		// From now on every request is answered: new intents, and the first one replayed.
		for i, n := range alive {
			r := postBriefly(n.base, chatBody("oncegate-mock", fmt.Sprintf("once elected, %d", i), ""), fmt.Sprintf("readme-cluster-elected-%d", i))
			if r.Status != http.StatusOK {
				t.Errorf("%s, a new intent after the election: %d %v %s", n.name, r.Status, r.Err, r.Body)
			}
			r = postBriefly(n.base, body, "readme-cluster-1")
			if r.Status != http.StatusOK || string(r.Body) != string(first.Body) || r.Header.Get("Oncegate-Idempotency") != "replayed" {
				t.Errorf("%s, the first intent again: %d %v %q, want the first body replayed:\n%s\nfirst:\n%s",
					n.name, r.Status, r.Err, r.Header.Get("Oncegate-Idempotency"), r.Body, first.Body)
			}
		}
	})
	httpClient.CloseIdleConnections()
	t.Logf("run time %s", time.Since(start).Round(time.Millisecond))
}

// survivorBound is how long after the KV_IDEM leader's SIGKILL the survivors may take to
// answer: the streams it led elect new leaders (4-9 s measured, notes/nats-jetstream-measured.md
// §7) and a request's store calls retry for up to 10 s.
const survivorBound = 20 * time.Second

// loggedReplicas is the replica count the node's "JetStream streams and buckets ready" log
// line names, or 0 without one.
func (n *clusterNode) loggedReplicas(t *testing.T) int {
	t.Helper()
	for _, l := range strings.Split(n.p.log.String(), "\n") {
		var line struct {
			Message  string `json:"message"`
			Replicas int    `json:"replicas"`
		}
		if json.Unmarshal([]byte(l), &line) == nil && line.Message == "JetStream streams and buckets ready" {
			return line.Replicas
		}
	}
	t.Errorf("%s logged no \"JetStream streams and buckets ready\" line", n.name)
	return 0
}

// streamLeader is the index of the node whose embedded server leads stream (asked through
// every node's NATS client port).
func streamLeader(t *testing.T, nodes []*clusterNode, stream string) int {
	t.Helper()
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.natsURL
	}
	js := dialJetStream(t, strings.Join(urls, ","))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info := st.CachedInfo()
	if info.Cluster == nil {
		t.Fatalf("stream %s has no cluster info", stream)
	}
	t.Logf("stream %s: R%d, leader %s, replicas %d", stream, info.Config.Replicas, info.Cluster.Leader, len(info.Cluster.Replicas))
	for i, n := range nodes {
		if n.serverName == info.Cluster.Leader {
			return i
		}
	}
	t.Fatalf("stream %s's leader %q is none of the nodes", stream, info.Cluster.Leader)
	return -1
}

// postBriefly posts a chat request with key, giving up after 10 s (a try within a CheckFor).
func postBriefly(base, body, key string) result {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+chatPath, strings.NewReader(body))
	if err != nil {
		return result{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := httpClient.Do(req)
	if err != nil {
		return result{Err: err}
	}
	defer resp.Body.Close()
	r := result{Status: resp.StatusCode, Header: resp.Header}
	r.Body, r.Err = io.ReadAll(resp.Body)
	return r
}

// flagValue is the value after flag in args.
func flagValue(t *testing.T, args []string, flag string) string {
	t.Helper()
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("the cluster page's command has no %s: %v", flag, args)
	return ""
}

// backendCalls sums every worker's lifetime backend calls (first attempts and retries) on
// the status board, once all n workers posted after since: a call made before since is then
// counted.
func backendCalls(t *testing.T, base string, n int, since time.Time) int64 {
	t.Helper()
	var calls int64
	testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
		r := send(http.MethodGet, base+"/v1/status", "", nil)
		var page struct {
			Workers map[string]struct {
				At       time.Time `json:"at"`
				Backends []struct {
					Budget struct {
						Requests int64 `json:"requests"`
						Retries  int64 `json:"retries"`
					} `json:"retry_budget"`
				} `json:"backends"`
			} `json:"workers"`
		}
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &page) != nil {
			return fmt.Errorf("/v1/status: %d %s", r.Status, r.Body)
		}
		if len(page.Workers) != n {
			return fmt.Errorf("%d workers on the status board, want %d", len(page.Workers), n)
		}
		calls = 0
		for id, w := range page.Workers {
			if !w.At.After(since) {
				return fmt.Errorf("worker %s last posted at %s, before the answer", id, w.At)
			}
			for _, b := range w.Backends {
				calls += b.Budget.Requests + b.Budget.Retries
			}
		}
		return nil
	})
	return calls
}

// readmePortsEnv, set to 1, makes TestReadmeCluster run the page's commands with their own
// ports (by hand only: they must be free, and two runs cannot share them).
const readmePortsEnv = "ONCEGATE_E2E_README_PORTS"

// readmeClusterNodes is the cluster commands of docs/operations/cluster.md (its first sh block:
// the build, then the three nodes) as the arguments of the built binary: every 127.0.0.1 port
// they name is replaced by a free port (the same free port wherever the page repeats it, so
// the routes still name the route ports), and each ./data/... directory by a temporary one.
// Nothing else changes.
func readmeClusterNodes(t *testing.T) []*clusterNode {
	t.Helper()
	blocks := clusterPageBlocks(t)
	cmds := shellCommands(blocks[:1])
	// The build is the package's oncegateBinary (the same `go build` of ./cmd/oncegate).
	const build, serve = "go build -o oncegate ./cmd/oncegate", "./oncegate serve "
	if len(cmds) != 4 || cmds[0].line != build {
		t.Fatalf("the cluster page's first block has %d commands, want %q and the three nodes':\n%s", len(cmds), build, strings.Join(commandLines(cmds), "\n"))
	}
	cmds = cmds[1:]
	literalPorts := os.Getenv(readmePortsEnv) == "1"
	ports := map[string]string{} // the page's port -> free port
	used := map[string]bool{}
	portRE := regexp.MustCompile(`127\.0\.0\.1:(\d+)`)
	dirRE := regexp.MustCompile(`\./data/[A-Za-z0-9_-]+`)
	dir := t.TempDir()
	nodes := make([]*clusterNode, len(cmds))
	host, _ := os.Hostname()
	for i, c := range cmds {
		if !strings.HasPrefix(c.line, serve) {
			t.Fatalf("node %d's command is %q, want one starting %q", i+1, c.line, serve)
		}
		line := portRE.ReplaceAllStringFunc(c.line, func(hp string) string {
			p := strings.TrimPrefix(hp, "127.0.0.1:")
			if literalPorts {
				return hp
			}
			for ports[p] == "" {
				// FreeAddr finds a free port but holds none: two asks may draw the same one.
				_, free, _ := net.SplitHostPort(testkit.FreeAddr(t))
				if !used[free] {
					ports[p], used[free] = free, true
				}
			}
			return "127.0.0.1:" + ports[p]
		})
		line = dirRE.ReplaceAllStringFunc(line, func(d string) string { return filepath.Join(dir, filepath.Base(d)) })
		args := strings.Fields(strings.TrimPrefix(line, "./oncegate "))
		n := &clusterNode{
			name:    fmt.Sprintf("node %d", i+1),
			base:    "http://" + flagValue(t, args, "--listen"),
			natsURL: "nats://" + flagValue(t, args, "--nats-listen"),
		}
		_, routePort, _ := net.SplitHostPort(flagValue(t, args, "--nats-cluster-listen"))
		n.serverName = host + "-" + routePort
		n.args = args
		nodes[i] = n
	}
	return nodes
}

// clusterPage is the page whose command blocks TestReadmeCluster and TestReadmeExternalCluster
// run, one block each; a block more fails them until a test runs it.
var clusterPage = filepath.Join("docs", "operations", "cluster.md")

// clusterPageBlocks is the page's sh blocks: the embedded cluster's, then the external one's.
func clusterPageBlocks(t *testing.T) []string {
	t.Helper()
	page := readRepoFile(t, clusterPage)
	noOtherShellFences(t, page)
	blocks := fencedBlocks(page, "sh")
	if len(blocks) != 2 {
		t.Fatalf("%s has %d sh blocks; the tests run two (the embedded cluster, the external one): run a new block in e2e/readme_cluster_test.go", clusterPage, len(blocks))
	}
	return blocks
}

// start runs the node's process.
func (n *clusterNode) start(t *testing.T) {
	t.Helper()
	t.Logf("%s: oncegate %s", n.name, strings.Join(n.args, " "))
	n.p = startProc(t, n.name, oncegateBinary(t), n.args...)
}

// waitClusterReady waits until every node's /readyz answers 200.
func waitClusterReady(t *testing.T, nodes []*clusterNode) {
	t.Helper()
	for i, n := range nodes {
		testkit.CheckFor(t, 60*time.Second, 50*time.Millisecond, func() error {
			if n.p.exited() {
				t.Fatalf("node %d exited: %v\n%s", i+1, n.p.err, n.p.log.String())
			}
			// The HTTP port is bound before the node waits for the cluster: ask briefly.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, n.base+"/readyz", nil)
			resp, err := httpClient.Do(req)
			if err != nil {
				return fmt.Errorf("node %d not ready: %w", i+1, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("node %d not ready: /readyz %d", i+1, resp.StatusCode)
			}
			return nil
		})
	}
}

// TestReadmeExternalCluster runs docs/operations/cluster.md's second sh block, the api and the
// worker role on an external NATS cluster, as written but for the addresses: each
// nats://nats-N:4222 becomes the client URL of the Nth of three stock nats-server processes
// (runNATSProcs), and the api's --listen 0.0.0.0:8080 a free loopback port. The api node must
// become ready (which needs the worker on the status board), answer a new intent, and replay it
// to a second copy with the same bytes and job id, with one backend call made by the worker.
func TestReadmeExternalCluster(t *testing.T) {
	t.Parallel() // processes and ports of its own; mostly waiting
	cmds := shellCommands(clusterPageBlocks(t)[1:2])
	const api, worker = "oncegate serve --role api ", "oncegate serve --role worker "
	if len(cmds) != 2 || !strings.HasPrefix(cmds[0].line, api) || !strings.HasPrefix(cmds[1].line, worker) {
		t.Fatalf("%s's second block has %d commands, want one starting %q and one starting %q:\n%s",
			clusterPage, len(cmds), api, worker, strings.Join(commandLines(cmds), "\n"))
	}
	urls := runNATSProcs(t, "always").URLs()
	listen := testkit.FreeAddr(t)
	serverRE := regexp.MustCompile(`nats://nats-(\d+):4222`)
	var procs []*proc
	for i, c := range cmds {
		line := serverRE.ReplaceAllStringFunc(c.line, func(u string) string {
			n := serverRE.FindStringSubmatch(u)[1]
			for j := range urls {
				if n == fmt.Sprint(j+1) {
					return urls[j]
				}
			}
			t.Fatalf("%s names %s; the test runs %d servers", clusterPage, u, len(urls))
			return ""
		})
		line = strings.ReplaceAll(line, "0.0.0.0:8080", listen)
		if strings.Contains(line, "://nats-") || strings.Contains(line, "0.0.0.0") {
			t.Fatalf("an address of %q is not one the test replaces: %s", c.line, line)
		}
		name := []string{"api", "worker"}[i]
		args := strings.Fields(strings.TrimPrefix(line, "oncegate "))
		t.Logf("%s: oncegate %s", name, strings.Join(args, " "))
		// The page's data dir is ./data, where an api node keeps its cold tier's index: here
		// that would be e2e/data, in the source tree, so the test gives each its own.
		args = append(args, "--data-dir", filepath.Join(t.TempDir(), name))
		procs = append(procs, startProc(t, name, oncegateBinary(t), args...))
	}
	base := "http://" + listen
	waitReady(t, base, procs...)

	body := chatBody("oncegate-mock", "one intent, external NATS", "")
	hdr := map[string]string{"Idempotency-Key": "readme-external-1"}
	first := postChat(t, base, body, hdr)
	expect(t, first, http.StatusOK, "created")
	again := postChat(t, base, body, hdr)
	expect(t, again, http.StatusOK, "replayed")
	if string(again.Body) != string(first.Body) || again.Header.Get("Oncegate-Job-Id") != first.Header.Get("Oncegate-Job-Id") {
		t.Errorf("the copy got another answer (job %s, first %s):\n%s\nfirst:\n%s",
			again.Header.Get("Oncegate-Job-Id"), first.Header.Get("Oncegate-Job-Id"), again.Body, first.Body)
	}
	if calls := backendCalls(t, base, 1, first.End); calls != 1 {
		t.Errorf("the worker made %d backend calls for one intent, want 1", calls)
	}
	httpClient.CloseIdleConnections()
}
