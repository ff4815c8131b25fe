package gateway

import (
	"fmt"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
)

// TestChooseReplicas: left at 0, nats.replicas is 3 on an embedded cluster node whose routes
// name 3 or more nodes, whatever the in-process client has discovered yet (at start it knows
// fewer, and the README's three nodes got 1), and on an external cluster of 3 or more servers.
func TestChooseReplicas(t *testing.T) {
	routes := func(n int) config.NATSCluster {
		cl := config.NATSCluster{Name: "oncegate", Listen: "127.0.0.1:6222"}
		for i := range n {
			cl.Routes = append(cl.Routes, fmt.Sprintf("nats://127.0.0.1:%d", 6222+i))
		}
		return cl
	}
	for _, tc := range []struct {
		name  string
		set   int
		shape natsShape
		want  int
	}{
		{"embedded single server", 0, shapeOf(config.NATSCluster{}, nil, true), 1},
		{"embedded cluster of three routes", 0, shapeOf(routes(3), nil, true), 3},
		{"embedded cluster of five routes", 0, shapeOf(routes(5), nil, true), 3},
		{"embedded cluster of two routes", 0, shapeOf(routes(2), nil, true), 1},
		{"embedded cluster, replicas set to 1", 1, shapeOf(routes(3), nil, true), 1},
		{"embedded cluster, replicas set to 5", 5, shapeOf(routes(5), nil, true), 5},
		{"embedded single server, replicas set to 3", 3, shapeOf(config.NATSCluster{}, nil, true), 3},
		{"external single server", 0, natsShape{servers: 1}, 1},
		{"external single server with three URLs", 0, natsShape{servers: 3}, 1},
		{"external cluster of three", 0, natsShape{cluster: "c", servers: 3}, 3},
		{"external cluster of two", 0, natsShape{cluster: "c", servers: 2}, 1},
		{"external cluster of five", 0, natsShape{cluster: "c", servers: 5}, 3},
		{"external cluster, replicas set to 1", 1, natsShape{cluster: "c", servers: 3}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := chooseReplicas(tc.set, tc.shape); got != tc.want {
				t.Errorf("chooseReplicas(%d, %+v) = %d, want %d", tc.set, tc.shape, got, tc.want)
			}
		})
	}
}
