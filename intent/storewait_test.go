package intent_test

import (
	"testing"
	"time"

	"github.com/oncegate/oncegate/intent"
)

// TestStoreWait: how long admission waits for an unavailable store follows the client's stated
// timeout (less a tenth, at least a second, so that the 503 reaches the client first), within
// the configured bounds; a client that states none waits admission.store_wait.
func TestStoreWait(t *testing.T) {
	core := func(wait, most time.Duration) *intent.Core {
		return intent.New(intent.Deps{Options: intent.Options{StoreWait: wait, StoreWaitMax: most}})
	}
	cases := []struct {
		name       string
		wait, most time.Duration // Options.StoreWait, StoreWaitMax
		stated     time.Duration // Request.ClientTimeout
		want       time.Duration
	}{
		{"none stated: the configured wait", 10 * time.Second, time.Minute, 0, 10 * time.Second},
		{"10 s client: a second before it gives up", 10 * time.Second, time.Minute, 10 * time.Second, 9 * time.Second},
		{"30 s client: a tenth before", 10 * time.Second, time.Minute, 30 * time.Second, 27 * time.Second},
		{"an SDK's 600 s default: the configured most", 10 * time.Second, time.Minute, 600 * time.Second, time.Minute},
		{"a 1 s client: at least a second", 10 * time.Second, time.Minute, time.Second, time.Second},
		{"nothing configured: jsretry's window", 0, 0, 0, 10 * time.Second},
		{"nothing configured, 30 s client: bounded by the wait", 0, 0, 30 * time.Second, 10 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := core(tc.wait, tc.most).StoreWait(&intent.Request{ClientTimeout: tc.stated})
			if got != tc.want {
				t.Errorf("store wait %s, want %s", got, tc.want)
			}
		})
	}
}
