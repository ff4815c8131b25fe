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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
)

// clusterNode is one node of the README's cluster as this test runs it.
type clusterNode struct {
	name       string
	args       []string
	p          *proc
	base       string // http://host:port
	natsURL    string // its --nats-listen
	serverName string // its JetStream peer name, <hostname>-<route port>
}

// TestReadmeCluster runs exactly the three commands of the README's "Cluster" section (its
// first sh block) as three processes of the oncegate binary: `go run ./cmd/oncegate` is the
// built binary, every 127.0.0.1 port the commands name is replaced by a free port (the same
// free port wherever the README repeats it, so the routes still name the route ports), and
// each ./data/... directory by a temporary one. Nothing else is changed.
//
// It waits for all three /readyz, sends one intent (one Idempotency-Key) to node 1, then to
// node 2 and node 3: one backend execution across the cluster (the workers' lifetime request
// counts on the shared status board, read after every worker posted again) and one body.
// Then it SIGKILLs node 1 (a node that holds no stream with fewer than three replicas, see
// killable) and shows the other two still answer a new intent, the same to both: the cluster
// keeps its quorum.
func TestReadmeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three oncegate processes")
	}
	nodes := readmeClusterNodes(t)
	for _, n := range nodes {
		n.start(t)
	}
	waitClusterReady(t, nodes)

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

	t.Run("SIGKILL of one node keeps a quorum", func(t *testing.T) {
		victim := killable(t, nodes)
		t.Logf("SIGKILL node %d (%s)", victim+1, nodes[victim].serverName)
		nodes[victim].p.kill(t)
		var alive []*clusterNode
		for i, n := range nodes {
			if i != victim {
				alive = append(alive, n)
			}
		}
		// A new intent: the same key is retried (safe: one intent) until the survivors
		// answer, which may take a leader election (4-9 s).
		body := chatBody("oncegate-mock", "after a node is gone", "")
		const key = "readme-cluster-2"
		var after result
		testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			after = postBriefly(alive[0].base, body, key)
			if after.Status != http.StatusOK {
				return fmt.Errorf("survivor %s: %d %v %s", alive[0].base, after.Status, after.Err, after.Body)
			}
			return nil
		})
		r := postBriefly(alive[1].base, body, key)
		if r.Status != http.StatusOK || string(r.Body) != string(after.Body) || r.Header.Get("Oncegate-Idempotency") != "replayed" {
			t.Fatalf("the other survivor: %d %v %s %q, want the same body replayed:\n%s",
				r.Status, r.Err, r.Body, r.Header.Get("Oncegate-Idempotency"), after.Body)
		}
	})
	httpClient.CloseIdleConnections()
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
	t.Fatalf("the README's cluster command has no %s: %v", flag, args)
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

// killable is the node to SIGKILL: node 1 unless it holds a replica of a stream with fewer
// than three replicas (losing it would lose that stream, not an election), else the first
// node that holds none. When every node holds one (streams created R1), it scales them to R3
// first, as an operator would, and answers node 1.
func killable(t *testing.T, nodes []*clusterNode) int {
	t.Helper()
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.natsURL
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Name("e2e-cluster"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fragile := map[string][]string{} // server name -> streams with < 3 replicas it holds
	var placement []string
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		if info.Cluster == nil {
			continue
		}
		holders := []string{info.Cluster.Leader}
		for _, p := range info.Cluster.Replicas {
			holders = append(holders, p.Name)
		}
		placement = append(placement, fmt.Sprintf("%s R%d on %v", info.Config.Name, info.Config.Replicas, holders))
		if info.Config.Replicas < 3 {
			for _, h := range holders {
				fragile[h] = append(fragile[h], info.Config.Name)
			}
		}
	}
	if err := lister.Err(); err != nil {
		t.Fatalf("listing streams: %v", err)
	}
	t.Logf("stream placement: %s", strings.Join(placement, "; "))
	for i, n := range nodes {
		if len(fragile[n.serverName]) == 0 {
			return i
		}
	}
	// Until gateway start creates them R3 (nats.replicas), scale them up as an operator
	// would; a start never lowers them again.
	t.Logf("every node holds a stream with fewer than 3 replicas: scaling them to R3 through the NATS API")
	for _, names := range fragile {
		for _, name := range names {
			st, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatalf("stream %s: %v", name, err)
			}
			cfg := st.CachedInfo().Config
			if cfg.Replicas >= 3 {
				continue
			}
			cfg.Replicas = 3
			if _, err := js.UpdateStream(ctx, cfg); err != nil {
				t.Fatalf("scaling %s to R3: %v", name, err)
			}
		}
	}
	for _, names := range fragile {
		for _, name := range names {
			testkit.CheckFor(t, 20*time.Second, 100*time.Millisecond, func() error {
				st, err := js.Stream(ctx, name)
				if err != nil {
					return err
				}
				info := st.CachedInfo()
				if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
					return fmt.Errorf("stream %s: cluster %+v, want a leader and two replicas", name, info.Cluster)
				}
				for _, r := range info.Cluster.Replicas {
					if !r.Current {
						return fmt.Errorf("stream %s: replica %s not current", name, r.Name)
					}
				}
				return nil
			})
		}
	}
	return 0
}

// readmeClusterNodes is the README's three cluster commands (its "Cluster" section's first sh
// block) as the arguments of the built binary: every 127.0.0.1 port they name is replaced by
// a free port (the same free port wherever the README repeats it, so the routes still name
// the route ports), and each ./data/... directory by a temporary one. Nothing else changes.
func readmeClusterNodes(t *testing.T) []*clusterNode {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := fencedBlocks(readmeSection(t, string(readme), "## Cluster"), "sh")
	if len(blocks) == 0 {
		t.Fatal("the README's Cluster section has no sh block")
	}
	cmds := shellCommands(blocks[:1])
	if len(cmds) != 3 {
		t.Fatalf("the README's cluster block has %d commands, want the three nodes':\n%s", len(cmds), strings.Join(commandLines(cmds), "\n"))
	}
	const goRun = "go run ./cmd/oncegate "
	ports := map[string]string{} // README port -> free port
	used := map[string]bool{}
	portRE := regexp.MustCompile(`127\.0\.0\.1:(\d+)`)
	dirRE := regexp.MustCompile(`\./data/[A-Za-z0-9_-]+`)
	dir := t.TempDir()
	nodes := make([]*clusterNode, len(cmds))
	host, _ := os.Hostname()
	for i, c := range cmds {
		if !strings.HasPrefix(c.line, goRun) {
			t.Fatalf("command %d is %q, want one starting %q", i+1, c.line, goRun)
		}
		line := portRE.ReplaceAllStringFunc(c.line, func(hp string) string {
			p := strings.TrimPrefix(hp, "127.0.0.1:")
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
		args := strings.Fields(strings.TrimPrefix(line, goRun))
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
