package e2e

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives the tests: every gateway the tests
// start must stop completely (NATS server, connections, workers, HTTP server, stream writers).
// The shared test client's idle keep-alive connections are closed before the check, so what
// is left belongs to the code under test. One goroutine is ignored, see leakOptions.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(closeIdleAfter{m}, leakOptions()...)
}

// leakOptions are the goleak options of this package. The one ignored goroutine is
// fasthttp's process-wide clock: fasthttp (under Fiber) starts it with
// serverDateOnce.Do(updateServerDate) (fasthttp@v1.51.0 header.go:2285-2297, server.go:2820)
// the first time any server serves, once per process, and it loops forever by design; it is
// not owned by any gateway and no API stops it.
func leakOptions() []goleak.Option {
	return []goleak.Option{goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1")}
}

// closeIdleAfter runs the tests, then closes the shared client's idle connections so their
// read/write loops are gone before goleak looks, and waits (bounded) for the fasthttp
// worker-pool cleaners of stopped servers to end.
type closeIdleAfter struct{ m *testing.M }

func (c closeIdleAfter) Run() int {
	code := c.m.Run()
	removeOncegateBinary()
	httpClient.CloseIdleConnections()
	waitFasthttpCleaners(15 * time.Second)
	return code
}

// fasthttpCleaner is the goroutine fasthttp's worker pool runs per server: Server.Shutdown
// closes its stop channel, but the goroutine only looks at it between sleeps of
// MaxIdleWorkerDuration (10 s by default, and Fiber v2 does not expose the setting), so it
// outlives Gateway.Stop by up to 10 s (fasthttp@v1.51.0 workerpool.go:59-70).
const fasthttpCleaner = "github.com/valyala/fasthttp.(*workerPool).Start.func2"

// waitFasthttpCleaners waits until no fasthttp worker-pool cleaner goroutine is left, at most
// timeout. It ignores nothing: a cleaner still there after timeout is reported by goleak.
func waitFasthttpCleaners(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		if !bytes.Contains(buf, []byte(fasthttpCleaner)) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
