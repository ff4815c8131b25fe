package testkit

import (
	"os"
	"sync"
	"syscall"
	"testing"
)

// HoldFile replaces the file at path with a FIFO that the test holds open: a reader of path
// blocks, as on a disk that does not answer, until release, and then reads an empty file. A
// store's restore held this way is a real one, stopped at a real read (the embedded server's
// restore of a stream reads its msgs/index.db first; empty, the stream is rebuilt from its
// message blocks, as after a crash). release is also called when the test ends.
func HoldFile(t testing.TB, path string) (release func()) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	// Read-write: the open does not wait for a reader, and a reader sees no end of file while
	// it is open.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { f.Close() }) }
	t.Cleanup(release)
	return release
}
