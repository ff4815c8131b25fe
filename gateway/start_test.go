package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

func start(t *testing.T, cfg *config.Config) (*gateway.Gateway, error) {
	t.Helper()
	return startWithin(t, cfg, 30*time.Second)
}

// startWithin is start given d to come up (a start that raises every stream's replicas
// waits for each to scale, within the setup's one-minute window).
func startWithin(t *testing.T, cfg *config.Config, d time.Duration) (*gateway.Gateway, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	gw, err := gateway.Start(ctx, cfg, zerolog.New(io.Discard), func(string) string { return "" })
	if err == nil {
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := gw.Stop(sctx); err != nil {
				t.Errorf("stop: %v", err)
			}
		})
	}
	return gw, err
}

// TestStartFailureStopsWhatStarted: a start that fails returns its cause (no panic on a nil
// gateway) and leaves nothing behind: the HTTP port and the data dir's lock are free again.
func TestStartFailureStopsWhatStarted(t *testing.T) {
	t.Run("HTTP port taken: fails before the store", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cfg := gatewaykit.Config(t)
		cfg.Listen = ln.Addr().String()
		cfg.DataDir = filepath.Join(t.TempDir(), "data")
		gw, err := start(t, cfg)
		var se *gateway.StartError
		if gw != nil || !errors.As(err, &se) || se.Field != "listen" || !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("gateway %v, err %v; want a listen StartError (address in use)", gw, err)
		}
		if _, err := os.Stat(cfg.DataDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("data dir created (%v): the port must fail before the store", err)
		}
	})

	t.Run("data dir held by a running gateway", func(t *testing.T) {
		first := gatewaykit.StartGateway(t, nil)
		cfg := gatewaykit.Config(t)
		cfg.DataDir = first.Cfg.DataDir
		cfg.Listen = testkit.FreeAddr(t)
		gw, err := start(t, cfg)
		var se *gateway.StartError
		if gw != nil || !errors.As(err, &se) || se.Field != "data_dir" || !errors.Is(err, natsrv.ErrLocked) {
			t.Fatalf("gateway %v, err %v; want a data_dir StartError (locked)", gw, err)
		}
		ln, err := net.Listen("tcp", cfg.Listen) // the refused gateway had bound it first
		if err != nil {
			t.Fatalf("the refused gateway kept its HTTP port: %v", err)
		}
		ln.Close()
	})

	t.Run("failure after the embedded NATS started", func(t *testing.T) {
		cfg := gatewaykit.Config(t)
		cfg.Backends[0].Type = "no-such-type" // not validated: fails when the workers start
		if gw, err := start(t, cfg); gw != nil || err == nil {
			t.Fatalf("gateway %v, err %v; want the backend error", gw, err)
		}
		good := gatewaykit.Config(t)
		good.DataDir = cfg.DataDir
		if _, err := start(t, good); err != nil {
			t.Fatalf("the failed start kept the data dir or port: %v", err)
		}
	})
}

// TestConcurrentFirstStartsOnExternalCluster: two gateways started at the same moment against a
// fresh external 3-node cluster (nats.url names all three, replicas chosen: 3) both start. Two
// processes creating the same new R3 stream at once both go unanswered (seen here with
// nats-server 2.15: both gateways exited with "ensure stream JOBS: context deadline exceeded",
// or CHUNKS, on every round), so the start retries within its window, as a cluster node does.
// Each round is a fresh cluster: the race is in the first creation.
func TestConcurrentFirstStartsOnExternalCluster(t *testing.T) {
	for round := range 2 {
		t.Run(fmt.Sprintf("round %d", round+1), func(t *testing.T) {
			c := testkit.RunCluster(t, 3)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				cfg := clusterConfig(t, c, 0)
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = start(t, cfg)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("gateway %d: %v", i+1, err)
				}
			}
			_, js := c.Connect(t)
			wantReplicas(t, js, 3, nil)
		})
	}
}
