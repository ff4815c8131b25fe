package replicas

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestDescribe: what a scale-up that gave up says of the stream's last cluster state.
func TestDescribe(t *testing.T) {
	created := time.Date(2026, 12, 7, 17, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		ci   *jetstream.ClusterInfo
		want string
	}{
		{"never read", nil, "its cluster state was never read"},
		{"one replica behind", &jetstream.ClusterInfo{Leader: "n1", Replicas: []*jetstream.PeerInfo{
			{Name: "n2", Current: true, Active: 300 * time.Millisecond},
			{Name: "n3", Lag: 7, Active: 90 * time.Second},
		}}, `last seen: leader "n1", replica n2 current (lag 0, heard 300ms ago), replica n3 not current (lag 7, heard 1m30s ago)`},
		{"a reconfiguration in flight", &jetstream.ClusterInfo{Leader: "n1", Desired: &jetstream.DesiredClusterInfo{
			Created:  created,
			Replicas: []*jetstream.DesiredPeerInfo{{Name: "n1"}, {Name: "n2"}, {Name: "n3"}},
			Status:   &jetstream.DesiredClusterInfoStatus{Description: "waiting for n3 to catch up", Err: "catchup stalled"},
		}}, `last seen: leader "n1", moving to [n1 n2 n3] since 2026-12-07T17:00:00Z: waiting for n3 to catch up (catchup stalled)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := describe(tc.ci); got != tc.want {
				t.Errorf("describe:\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}
