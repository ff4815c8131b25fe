package e2e

// The helpers this package's tests share. Helpers that only one test uses stay next to it.

import (
	"fmt"
	"time"

	"github.com/oncegate/oncegate/internal/mockllm"
)

// pollEvery is how often a testkit.CheckFor condition of this package is tried.
const pollEvery = 10 * time.Millisecond

// inFlight is a testkit.CheckFor condition: mock has n backend calls in flight.
func inFlight(mock *mockllm.Server, n int64) func() error {
	return func() error {
		if got := mock.Stats().InFlight; got != n {
			return fmt.Errorf("%d backend calls in flight, want %d", got, n)
		}
		return nil
	}
}
