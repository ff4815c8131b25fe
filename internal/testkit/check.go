package testkit

import (
	"testing"
	"time"
)

// CheckFor calls fn every interval until it returns nil, and fails the test with fn's last
// error if that has not happened within timeout (the nats-server test suite's checkFor).
func CheckFor(t testing.TB, timeout, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testkit: still failing after %s: %v", timeout, err)
		}
		time.Sleep(every)
	}
}

// RequireChanRead returns the next value from ch, or fails the test if none arrives within
// timeout.
func RequireChanRead[T any](t testing.TB, ch <-chan T, timeout time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("testkit: nothing received within %s", timeout)
	}
	var zero T
	return zero
}

// RequireNoChanRead fails the test if ch yields a value within wait.
func RequireNoChanRead[T any](t testing.TB, ch <-chan T, wait time.Duration) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("testkit: unexpected value received: %v", v)
	case <-time.After(wait):
	}
}
