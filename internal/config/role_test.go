package config

import (
	"errors"
	"strings"
	"testing"
)

// TestRoleAPINeedsReachableNATS: an api-only process must run on a NATS that workers can
// reach (an external one, or the embedded server with a port), and a worker-only process on one
// that an API can reach; every other combination passes.
func TestRoleAPINeedsReachableNATS(t *testing.T) {
	for _, tc := range []struct {
		name, role, url, listen string
		refused                 bool
	}{
		{name: "api, embedded, no port", role: "api", refused: true},
		{name: "api, embedded with a port", role: "api", listen: "127.0.0.1:4222"},
		{name: "api, external NATS", role: "api", url: "nats://127.0.0.1:4222"},
		{name: "all, embedded, no port", role: "all"},
		{name: "worker, embedded with a port", role: "worker", listen: "127.0.0.1:4222"},
		{name: "worker, embedded, no port", role: "worker", refused: true},
		{name: "worker, external NATS", role: "worker", url: "nats://127.0.0.1:4222"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Role, c.NATS.URL, c.NATS.Listen = tc.role, tc.url, tc.listen
			err := c.Validate()
			var ve *ValidationError
			if !tc.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.As(err, &ve) || len(ve.Errors) != 1 || ve.Errors[0].Path != "role" ||
				!strings.Contains(ve.Errors[0].Message, "--nats-listen") || !strings.Contains(ve.Errors[0].Message, "--nats-url") {
				t.Fatalf("err %v, want one role error naming --nats-listen and --nats-url", err)
			}
		})
	}
}
