package natsrv

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit/freeport"
)

// routeAddrs are n free loopback ports for routes, picked before any node starts: every node
// must name every route port up front. They are outside the ephemeral range (freeport), where
// another package's outgoing connection could take one before its node binds it.
func routeAddrs(t *testing.T, n int) (addrs, routes []string) {
	t.Helper()
	for range n {
		a := freeport.Addr(t)
		addrs = append(addrs, a)
		routes = append(routes, "nats://"+a)
	}
	return addrs, routes
}

// startNodes starts one clustered server per address, concurrently (each Start waits for the
// others), and shuts them down at cleanup.
func startNodes(t *testing.T, addrs, routes []string) []*Server {
	t.Helper()
	type started struct {
		i   int
		srv *Server
		err error
	}
	ch := make(chan started, len(addrs))
	for i, a := range addrs {
		go func() {
			srv, err := Start(startCtx(t), Options{StoreDir: t.TempDir(),
				Cluster: Cluster{Name: "oncegate-test", Listen: a, Routes: routes}})
			ch <- started{i, srv, err}
		}()
	}
	nodes := make([]*Server, len(addrs))
	var errs []error
	for range addrs {
		s := <-ch
		nodes[s.i] = s.srv
		if s.err != nil {
			errs = append(errs, fmt.Errorf("node %d: %w", s.i, s.err))
		}
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			if n != nil {
				n.Shutdown()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return nodes
}

// TestClusterForms: three embedded servers given the same routes form one JetStream cluster
// before Start returns: each is named after its route port, and an R3 stream created through
// one node's in-process connection is led by one of them and readable through another's.
func TestClusterForms(t *testing.T) {
	addrs, routes := routeAddrs(t, 3)
	nodes := startNodes(t, addrs, routes)
	names := map[string]bool{}
	for i, n := range nodes {
		_, port, _ := net.SplitHostPort(addrs[i])
		if !strings.HasSuffix(n.Name(), "-"+port) {
			t.Errorf("node %d is named %q, want <hostname>-%s", i, n.Name(), port)
		}
		names[n.Name()] = true
	}
	ctx := startCtx(t)
	nc, err := nodes[0].Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// Start returns once the meta leader is elected and this node's view is current; the
	// leader may not have heard from every peer yet, and refuses an R3 placement meanwhile
	// ("no suitable peers for placement, peer offline", seen in CI), as the gateway's start
	// knows and retries.
	for try := 0; ; try++ {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
		var apiErr *jetstream.APIError
		if err == nil {
			break
		}
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10005 || try == 100 {
			t.Fatalf("R3 stream on a freshly started cluster: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	nc2, err := nodes[2].Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, _ := jetstream.New(nc2)
	st, err := js2.Stream(ctx, "R3")
	if err != nil {
		t.Fatalf("the stream through another node: %v", err)
	}
	info := st.CachedInfo()
	if info.Cluster == nil || !names[info.Cluster.Leader] || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream cluster info %+v, want a leader among %v and two replicas", info.Cluster, names)
	}
}

// TestClusterNoQuorum: a node whose routes name two nodes that never start cannot elect a
// meta leader; Start gives up at FormTimeout with ErrNoQuorum saying how many nodes it
// reached, and leaves the store directory free.
func TestClusterNoQuorum(t *testing.T) {
	addrs, routes := routeAddrs(t, 3)
	dir := t.TempDir()
	_, err := Start(startCtx(t), Options{StoreDir: dir,
		Cluster: Cluster{Name: "alone", Listen: addrs[0], Routes: routes, FormTimeout: 2 * time.Second}})
	if !errors.Is(err, ErrNoQuorum) || !strings.Contains(err.Error(), "0 of the 2 other node(s) connected") {
		t.Fatalf("err %v, want ErrNoQuorum with 0 of 2 nodes connected", err)
	}
	ns, err := Start(startCtx(t), Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("the failed start kept the lock: %v", err)
	}
	ns.Shutdown()
}

// TestClusterBusyListen: a taken route port is ErrClusterListen with the system's reason, not
// the client listen's ErrListen and not a wait for the deadline.
func TestClusterBusyListen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, routes := routeAddrs(t, 2)
	_, err = Start(startCtx(t), Options{StoreDir: t.TempDir(), Listen: "127.0.0.1:0",
		Cluster: Cluster{Name: "busy", Listen: ln.Addr().String(), Routes: append(routes, "nats://"+ln.Addr().String())}})
	if !errors.Is(err, ErrClusterListen) || errors.Is(err, ErrListen) || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("err %v, want ErrClusterListen (address already in use)", err)
	}
}
