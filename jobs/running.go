package jobs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Whether an execution still runs is asked of the workers themselves, over core NATS. A lease
// that ran out says only that its owner's renewals did not land: in the fault suite's row 3b
// an owner whose renewal lost the race at a partition's heal, or that held a finished answer
// while its COMPLETED write waited for the new leader, was taken over and its intent executed
// a second time. Core NATS needs no stream leader, so an owner that can be reached at all
// answers while the records' bucket is still electing. An owner that is dead, paused or cut
// off does not answer, and the taker goes on as before (its revision fences the owner).

// runningPrefix starts the subject a worker pool answers on: exec.running.<key>.<epoch>.
const runningPrefix = "exec.running."

// runningAll is what a pool subscribes to.
const runningAll = runningPrefix + "*.*"

// RunningWait is how long Running waits for an owner's answer. On loopback or a LAN the answer
// takes well under a millisecond; a pool answers only for what it runs, so a takeover from a
// dead owner waits this long once (while other pools listen; with none, no responders says
// so at once).
const RunningWait = 250 * time.Millisecond

// runningYes is the answer's body.
var runningYes = []byte("running")

// RunningSubject is the subject on which the worker running epoch of key answers.
func RunningSubject(key string, epoch int) string {
	return runningPrefix + key + "." + strconv.Itoa(epoch)
}

// Running asks the workers whether one of them runs epoch of key now. It reports true only
// when a worker says so within RunningWait (or ctx's deadline, if sooner); otherwise false
// and why none was heard (nats.ErrNoResponders, a timeout, a failed request), for the
// taker's log.
func Running(ctx context.Context, nc *nats.Conn, key string, epoch int) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, RunningWait)
	defer cancel()
	m, err := nc.RequestWithContext(rctx, RunningSubject(key, epoch), nil)
	if err != nil {
		return false, fmt.Errorf("jobs: is %s epoch %d running: %w", key, epoch, err)
	}
	if string(m.Data) != string(runningYes) {
		return false, fmt.Errorf("jobs: is %s epoch %d running: answered %q", key, epoch, m.Data)
	}
	return true, nil
}

// AnswerRunning subscribes to every execution's running subject and answers those that runs
// reports true for; the others get no answer (another pool may run them). The caller
// unsubscribes.
func AnswerRunning(nc *nats.Conn, runs func(key string, epoch int) bool) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(runningAll, func(m *nats.Msg) {
		key, epoch, err := parseRunning(m.Subject)
		if err != nil || m.Reply == "" || !runs(key, epoch) {
			return
		}
		_ = m.Respond(runningYes)
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: answer running: %w", err)
	}
	return sub, nil
}

// errRunningSubject is a running subject that names no execution.
var errRunningSubject = errors.New("jobs: not a running subject")

// parseRunning splits exec.running.<key>.<epoch>.
func parseRunning(subject string) (string, int, error) {
	rest, ok := strings.CutPrefix(subject, runningPrefix)
	if !ok {
		return "", 0, errRunningSubject
	}
	key, e, ok := strings.Cut(rest, ".")
	if !ok || key == "" {
		return "", 0, errRunningSubject
	}
	epoch, err := strconv.Atoi(e)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %w", errRunningSubject, err)
	}
	return key, epoch, nil
}
