package config

import (
	"errors"
	"strings"
	"testing"
)

// TestNATSCluster: an embedded cluster node needs its name, a fixed route port and routes
// that name every node, itself included; a half-given cluster is one line naming the missing
// flags, and every other mistake is one line on its field. A node of a cluster may run one
// role alone without a client port (the other nodes reach its streams over the routes).
func TestNATSCluster(t *testing.T) {
	routes := []string{"nats://127.0.0.1:6222", "nats://127.0.0.1:6223", "nats://127.0.0.1:6224"}
	node := func(c *Config) {
		c.NATS.Cluster = NATSCluster{Name: "oncegate", Listen: "127.0.0.1:6222", Routes: routes}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		path   string // "" = valid
		says   string
	}{
		{"three nodes", node, "", ""},
		{"hostnames in the routes", func(c *Config) {
			node(c)
			c.NATS.Cluster.Listen = "0.0.0.0:6222"
			c.NATS.Cluster.Routes = []string{"nats://gw1:6222", "nats-route://gw2:6222", "nats://gw3:6222"}
		}, "", ""},
		{"api role without a client port", func(c *Config) { node(c); c.Role = "api" }, "", ""},
		{"server name", func(c *Config) { node(c); c.NATS.Cluster.ServerName = "gw-1" }, "", ""},
		{"name only", func(c *Config) { c.NATS.Cluster.Name = "oncegate" }, "nats.cluster",
			"missing --nats-cluster-listen HOST:PORT (nats.cluster.listen), --nats-routes URL,URL,... (nats.cluster.routes)"},
		{"routes only", func(c *Config) { c.NATS.Cluster.Routes = routes }, "nats.cluster",
			"missing --nats-cluster NAME (nats.cluster.name), --nats-cluster-listen"},
		{"with an external NATS", func(c *Config) { node(c); c.NATS.URL = "nats://n:4222" }, "nats.cluster", "drop --nats-url"},
		{"space in the name", func(c *Config) { node(c); c.NATS.Cluster.Name = "my cluster" }, "nats.cluster.name", "letters"},
		{"route port 0", func(c *Config) { node(c); c.NATS.Cluster.Listen = "127.0.0.1:0" }, "nats.cluster.listen", "fixed port"},
		{"route port is the client port", func(c *Config) { node(c); c.NATS.Listen = "127.0.0.1:6222" }, "nats.cluster.listen", "must differ"},
		{"listen not host:port", func(c *Config) { node(c); c.NATS.Cluster.Listen = "6222" }, "nats.cluster.listen", "host:port"},
		{"route not a URL", func(c *Config) { node(c); c.NATS.Cluster.Routes = []string{"127.0.0.1:6222", routes[1]} }, "nats.cluster.routes[0]", "nats://HOST:PORT"},
		{"route without a port", func(c *Config) { node(c); c.NATS.Cluster.Routes = []string{routes[0], "nats://127.0.0.1"} }, "nats.cluster.routes[1]", "nats://HOST:PORT"},
		{"route twice", func(c *Config) { node(c); c.NATS.Cluster.Routes = []string{routes[0], routes[1], routes[0]} }, "nats.cluster.routes[2]", "twice"},
		{"one node", func(c *Config) { node(c); c.NATS.Cluster.Routes = routes[:1] }, "nats.cluster.routes", "at least two"},
		{"routes leave this node out", func(c *Config) { node(c); c.NATS.Cluster.Routes = routes[1:] }, "nats.cluster.routes", "does not name this node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(c)
			err := c.Validate()
			if tc.path == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Errors) != 1 || ve.Errors[0].Path != tc.path || !strings.Contains(ve.Errors[0].Message, tc.says) {
				t.Fatalf("err %v, want one error on %s saying %q", err, tc.path, tc.says)
			}
		})
	}
}

// TestNATSClusterYAML: the nats.cluster section decodes from a file (the walker knows its
// fields) and a misspelt key is caught with its place.
func TestNATSClusterYAML(t *testing.T) {
	c, err := Parse([]byte("nats:\n  cluster:\n    name: oncegate\n    listen: 127.0.0.1:6222\n    routes: [nats://127.0.0.1:6222, nats://127.0.0.1:6223]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cl := c.NATS.Cluster; cl.Name != "oncegate" || cl.Listen != "127.0.0.1:6222" || len(cl.Routes) != 2 {
		t.Fatalf("decoded %+v", cl)
	}
	_, err = Parse([]byte("nats:\n  cluster:\n    name: oncegate\n    route: [nats://127.0.0.1:6222]\n"))
	if err == nil || !strings.Contains(err.Error(), "nats.cluster.route") || !strings.Contains(err.Error(), "routes") {
		t.Fatalf("misspelt key: %v, want nats.cluster.route named with the closest field routes", err)
	}
}
