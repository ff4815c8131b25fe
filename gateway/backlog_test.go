package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/gateway"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestHTTPPortRefusedUntilServing: a node whose start waits (here for its cluster's majority,
// which never comes) refuses connections on its HTTP port, so a load balancer sends them to
// another node. Before, the port was bound at the start's first step: a balancer's connects
// succeeded into the kernel's backlog, requests waited there for seconds (a restarted node
// of the deployed row, issue 34: 5-7 s), their clients retried elsewhere and were answered,
// and then the node read the stale requests as new arrivals past the auto window and ran
// them again (25 of 37 duplicate executions in one long run).
func TestHTTPPortRefusedUntilServing(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Listen = testkit.FreeAddr(t)
	self := testkit.FreeAddr(t)
	cfg.NATS.Cluster = config.NATSCluster{Name: "oncegate-test", Listen: self, ServerName: "n1",
		Routes: []string{"nats://" + self, "nats://" + testkit.FreeAddr(t), "nats://" + testkit.FreeAddr(t)}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		gw, err := gateway.Start(ctx, cfg, zerolog.New(io.Discard), func(string) string { return "" })
		if err == nil {
			_ = gw.Stop(context.Background())
			err = fmt.Errorf("started without a majority")
		}
		done <- err
	}()
	// The start is well under way (its NATS server runs and waits for peers).
	testkit.CheckFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		c, err := net.Dial("tcp", self)
		if err != nil {
			return err
		}
		return c.Close()
	})
	for range 5 {
		c, err := net.Dial("tcp", cfg.Listen)
		if err == nil {
			c.Close()
			t.Fatalf("the HTTP port %s accepted a connection while the node was not serving", cfg.Listen)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("dial %s: %v, want connection refused", cfg.Listen, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("start returned no error")
	}
}
