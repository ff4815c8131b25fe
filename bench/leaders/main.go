// Command leaders prints which server leads each JetStream stream of a cluster, by node number:
// bench/cluster-cost.sh records it per run, because the load goes to node 1 and a stream led
// by another node costs each of its writes two more route crossings, so runs of one binary on
// fresh clusters differ by where the leaders landed.
//
//	go run ./bench/leaders nats://127.0.0.1:14222 nats://127.0.0.1:14223 nats://127.0.0.1:14224
//
// The URLs are the nodes' NATS client URLs in node order; it prints one line,
// "KV_IDEM=n2 JOBS=n1 ...", sorted by stream name.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "leaders:", err)
		os.Exit(1)
	}
}

func run(urls []string) error {
	if len(urls) == 0 {
		return errors.New("usage: leaders NATS_URL... (the nodes' client URLs, in node order)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	node := map[string]string{} // server name → n<i>
	var js jetstream.JetStream
	for i, u := range urls {
		nc, err := nats.Connect(u, nats.Name("bench-leaders"))
		if err != nil {
			return fmt.Errorf("node %d (%s): %w", i+1, u, err)
		}
		defer nc.Close()
		node[nc.ConnectedServerName()] = fmt.Sprintf("n%d", i+1)
		if js == nil {
			if js, err = jetstream.New(nc); err != nil {
				return err
			}
		}
	}
	var out []string
	streams := js.ListStreams(ctx)
	for info := range streams.Info() {
		leader := "none"
		if info.Cluster != nil && info.Cluster.Leader != "" {
			leader = node[info.Cluster.Leader]
			if leader == "" {
				leader = info.Cluster.Leader
			}
		}
		out = append(out, info.Config.Name+"="+leader)
	}
	if err := streams.Err(); err != nil {
		return fmt.Errorf("list streams: %w", err)
	}
	slices.Sort(out)
	fmt.Println(strings.Join(out, " "))
	return nil
}
