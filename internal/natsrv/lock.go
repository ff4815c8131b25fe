package natsrv

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// LockFile is the name of the lock file the embedded server holds in its store directory for
// as long as it runs. The lock is what stops a second process (a second `oncegate serve`, or
// `oncegate ledger --data-dir`) from opening the same JetStream files: two servers on one store
// would each keep their own idempotency state (exactly-once silently broken) and could corrupt
// the files. The lock is advisory (flock(2)) and belongs to the open file, so the kernel
// releases it when the holder exits, even by SIGKILL: a stale file never blocks a restart. The
// file's content (who holds it) is only there to name the holder in the refusal.
const LockFile = "oncegate.lock"

// ErrLocked is returned (as a [*LockedError]) when another process holds the store directory.
var ErrLocked = errors.New("natsrv: store directory in use")

// ErrStoreDir is returned when the store directory cannot be created or its lock file opened
// (a path that is a file, no write permission, a read-only file system).
var ErrStoreDir = errors.New("natsrv: unusable store directory")

// Holder says who holds a store directory's lock.
type Holder struct {
	PID     int       `json:"pid"`
	Host    string    `json:"host"`
	Started time.Time `json:"started"`
	// Name is the embedded server's name: "oncegate" for a gateway, "oncegate-ledger-cli" for
	// the ledger tool.
	Name string `json:"name"`
}

// LockedError is a store directory that another process holds.
type LockedError struct {
	Dir string
	// Holder is what the lock file says; zero when the holder had not written it yet.
	Holder Holder
}

// Error names the directory and its holder.
func (e *LockedError) Error() string { return e.Dir + " is in use by " + e.Who() }

// Who names the holder, its pid first (what an operator looks for), and the lock file.
func (e *LockedError) Who() string {
	h, lock := e.Holder, filepath.Join(e.Dir, LockFile)
	if h.PID == 0 {
		return fmt.Sprintf("another process (lock %s)", lock)
	}
	name := h.Name
	if name == "" {
		name = "oncegate"
	}
	return fmt.Sprintf("%s pid %d on host %s (started %s, lock %s)",
		name, h.PID, h.Host, h.Started.UTC().Format(time.RFC3339), lock)
}

// Is makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// dirLock is a held store-directory lock.
type dirLock struct {
	f *os.File
}

// lockDir creates dir if needed and takes its lock without waiting, recording the holder.
func lockDir(dir, name string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrStoreDir, dir, err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrStoreDir, dir, err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w %s: lock %s: %w", ErrStoreDir, dir, path, err)
	}
	if !held {
		le := &LockedError{Dir: dir}
		// The holder writes its record right after taking the lock: an empty or partial file
		// means it is starting, and the error says so without a pid.
		if data, err := os.ReadFile(path); err == nil {
			_ = json.Unmarshal(data, &le.Holder)
		}
		f.Close()
		return nil, le
	}
	host, _ := os.Hostname()
	rec, _ := json.Marshal(Holder{PID: os.Getpid(), Host: host, Started: time.Now().UTC(), Name: name})
	if err := writeHolder(f, append(rec, '\n')); err != nil {
		unlock(f)
		f.Close()
		return nil, fmt.Errorf("%w %s: write %s: %w", ErrStoreDir, dir, path, err)
	}
	return &dirLock{f: f}, nil
}

func writeHolder(f *os.File, rec []byte) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(rec, 0); err != nil {
		return err
	}
	return f.Sync()
}

// release empties the record (the next reader must not name a process that is gone) and
// drops the lock. The file stays: removing it could race with a process that just opened it
// and would then lock a name no longer on disk.
func (l *dirLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	unlock(l.f)
	_ = l.f.Close()
	l.f = nil
}
