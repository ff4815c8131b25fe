package workers

import (
	"net/http"
	"time"
)

// The client's deadline (Oncegate-Timeout, carried as Job.Deadline) is the client's, not the
// intent's outcome. When it passes, the HTTP side answers that client a gateway 504 that is
// not stored; here it only stops the gateway from *starting* attempts: no first attempt, no
// retry and no re-send begins after it. An attempt already running is never cut by it (it
// runs to the backend's own timeout), so other copies of the intent can still join it and the
// record ends with the real outcome. An execution whose deadline passed before any attempt
// reached a backend is released (FAILED, retryable): nothing ran, a retry executes again.

// pastDeadline reports whether the client's deadline passes within wait from now.
func (ex *execution) pastDeadline(wait time.Duration) bool {
	dl := ex.job.Deadline
	return !dl.IsZero() && !ex.pool.opts.Now().Add(wait).Before(dl)
}

// deadlineFailure is the released outcome of an execution whose client deadline passed before
// an attempt could start: the last refusal when a backend refused it, else a 504 that says
// nothing ran.
func (ex *execution) deadlineFailure(last *failure) *failure {
	if last == nil {
		last = &failure{status: http.StatusGatewayTimeout, body: ex.errorBody(http.StatusGatewayTimeout, "deadline_exceeded",
			"the client's deadline (Oncegate-Timeout) passed before the request reached a model backend; nothing ran, so a retry is safe")}
	}
	return released(last)
}

// released marks f as an outcome in which nothing ran: the key is released (FAILED, retryable)
// and the client is told when to come back.
func released(f *failure) *failure {
	f.refused = true
	if f.retryAfter == 0 {
		f.retryAfter = 1
	}
	return f
}
