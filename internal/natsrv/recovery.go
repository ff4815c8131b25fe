package natsrv

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// The embedded server is ready only once JetStream has restored every stream of its store.
// With a current index file (msgs/index.db) that takes milliseconds; without one the stream is
// rebuilt from its message blocks, which takes seconds per million messages (issue 43: 25.6 s
// for 6 M keys). nats-server stops writing a stream's index file while the stream holds more
// than a million subjects (filestore.go, highCardinalityThreshold) except at a clean shutdown,
// so after a crash every large store is rebuilt. Start therefore waits for a restore as long
// as it makes progress.

// The notices nats-server 2.15 logs around each stream's restore (server/jetstream.go,
// Account.EnableJetStream), matched by their format strings, not their text. A server whose
// formats differ is still waited for (its lines are signs of life) but reported as restoring
// nothing.
const (
	restoreBeginFormat = "  Starting restore for stream '%s > %s'"
	restoreDoneFormat  = "  Restored %s messages for stream '%s > %s' in %v"
)

const (
	// DefaultReadyTimeout is Options.ReadyTimeout's default.
	DefaultReadyTimeout = 10 * time.Second
	// DefaultStallTimeout is Options.StallTimeout's default. A rebuild reads a message block
	// (4-8 MB) every few hundred milliseconds at most; a start shows no sign of life for this
	// long only when it is stuck.
	DefaultStallTimeout = 30 * time.Second
	// readyPoll is how often Start looks at the server while it is not ready.
	readyPoll = 100 * time.Millisecond
	// reportEvery is how often a restore's progress is logged.
	reportEvery = 5 * time.Second
	// progressBytes is the I/O that counts as progress: a block read, not a probe's request.
	progressBytes = 64 << 10
)

// Recovery is how far the embedded server has got restoring its store, as Start sees it while
// it waits (Options.OnRecovery).
type Recovery struct {
	// Streams are the streams being restored now, by name ("KV_IDEM").
	Streams []string
	// Restored is the number of streams restored so far by this start.
	Restored int
	// Elapsed is the time since the first stream's restore began.
	Elapsed time.Duration
	// ReadBytes is what this process has read since the server started (a rebuild reads the
	// store's message blocks more than once); -1 where the system does not say (Linux's
	// /proc/self/io does).
	ReadBytes int64
	// StoreBytes is the size of the store's message blocks.
	StoreBytes int64
}

// String is the recovery in a few words, for a log line or an answer.
func (r Recovery) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "restoring stream %s for %s", strings.Join(r.Streams, ", "), r.Elapsed.Round(100*time.Millisecond))
	if r.ReadBytes >= 0 {
		fmt.Fprintf(&b, ", %s read", sizeText(r.ReadBytes))
	}
	fmt.Fprintf(&b, " (message blocks: %s)", sizeText(r.StoreBytes))
	return b.String()
}

// sizeText is n bytes in MB, or in kB below one MB.
func sizeText(n int64) string {
	if n < 1e6 {
		return strconv.FormatInt(n/1e3, 10) + " kB"
	}
	return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + " MB"
}

// serverLog is the embedded server's logger. It keeps the first fatal error, follows the
// streams the server restores, and counts the notices and warnings as signs of life; their
// text is dropped (the server runs quiet, as with NoLog). It is called from the server's
// goroutines, restores of several streams at once among them.
type serverLog struct {
	log zerolog.Logger

	mu        sync.Mutex
	fatal     error
	lines     uint64
	last      string               // the last notice or warning
	restoring map[string]time.Time // stream → when its restore began
	began     time.Time            // when the first restore of this start began
	restored  int
	announced bool // Start has said that the store is being restored
}

func newServerLog(log zerolog.Logger) *serverLog {
	return &serverLog{log: log, restoring: map[string]time.Time{}}
}

func (l *serverLog) Fatalf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal != nil {
		return
	}
	// Keep the server's error values (net.OpError for a port) for errors.As, with its text.
	fe := &startFailure{msg: fmt.Sprintf(format, v...)}
	for _, a := range v {
		if e, ok := a.(error); ok {
			fe.errs = append(fe.errs, e)
		}
	}
	l.fatal = fe
}

func (l *serverLog) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}

func (l *serverLog) Noticef(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines++
	l.last = fmt.Sprintf(format, v...)
	switch {
	case format == restoreBeginFormat && len(v) == 2:
		now := time.Now()
		if l.began.IsZero() {
			l.began = now
		}
		l.restoring[streamName(v[0], v[1])] = now
	case format == restoreDoneFormat && len(v) == 4:
		name := streamName(v[1], v[2])
		delete(l.restoring, name)
		l.restored++
		ev := l.log.Debug()
		if l.announced {
			ev = l.log.Info()
		}
		msgs, _ := strconv.ParseInt(strings.ReplaceAll(fmt.Sprint(v[0]), ",", ""), 10, 64)
		took, _ := v[3].(time.Duration)
		ev.Str("stream", name).Int64("messages", msgs).Dur("took", took).Msg("stream restored")
	}
}

func (l *serverLog) Warnf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines++
	l.last = fmt.Sprintf(format, v...)
}

func (*serverLog) Errorf(string, ...any) {}
func (*serverLog) Debugf(string, ...any) {}
func (*serverLog) Tracef(string, ...any) {}

// streamName is a stream as the restore notices name it: by name in the default account, else
// "account > name".
func streamName(account, stream any) string {
	acc, name := fmt.Sprint(account), fmt.Sprint(stream)
	if acc == server.DEFAULT_GLOBAL_ACCOUNT {
		return name
	}
	return acc + " > " + name
}

// logState is what Start reads of the server's log at each look.
type logState struct {
	lines     uint64
	last      string
	restoring []string // sorted
	began     time.Time
	restored  int
}

func (l *serverLog) state() logState {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := logState{lines: l.lines, last: l.last, began: l.began, restored: l.restored}
	for name := range l.restoring {
		s.restoring = append(s.restoring, name)
	}
	slices.Sort(s.restoring)
	return s
}

// announce marks the restore as told: the streams restored from now on are logged at info.
func (l *serverLog) announce() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.announced = true
}

// waitReady waits until ns accepts connections. Until the server begins restoring a stream it
// waits opts.ReadyTimeout (or until ctx's deadline); from then on it waits as long as the
// server shows progress at least every opts.StallTimeout: a line logged, or (where the system
// counts a process's I/O) 64 kB read or written, which a rebuild does block after block.
// Without such counters a restore under way counts as progress. ctx's end ends the wait. It
// returns nil when ready, the fatal error the server logged, or ErrNotReady saying why.
func waitReady(ctx context.Context, ns *server.Server, sl *serverLog, opts Options, jsDir string) error {
	start := time.Now()
	readyBy := start.Add(cmp.Or(opts.ReadyTimeout, DefaultReadyTimeout))
	if d, ok := ctx.Deadline(); ok && opts.ReadyTimeout == 0 {
		readyBy = d
	}
	stall := cmp.Or(opts.StallTimeout, DefaultStallTimeout)
	io0, ioOK := ioCounters()
	io, lines, lastProgress := io0, uint64(0), start
	var nextReport time.Time
	storeBytes := int64(-1)
	for !ns.ReadyForConnections(readyPoll) {
		if err := sl.err(); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", ErrNotReady, context.Cause(ctx))
		}
		now, st := time.Now(), sl.state()
		progressed := st.lines != lines
		lines = st.lines
		if cur, ok := ioCounters(); ok && ioOK {
			progressed = progressed || cur.total()-io.total() >= progressBytes
			io = cur
		} else if len(st.restoring) > 0 {
			progressed = true
		}
		if progressed {
			lastProgress = now
		}
		if st.began.IsZero() {
			if now.After(readyBy) {
				return fmt.Errorf("%w after %v", ErrNotReady, readyBy.Sub(start).Round(time.Millisecond))
			}
			continue
		}
		rec := Recovery{Streams: st.restoring, Restored: st.restored, Elapsed: now.Sub(st.began), ReadBytes: -1, StoreBytes: storeBytes}
		if ioOK {
			rec.ReadBytes = io.read - io0.read
		}
		if now.Sub(lastProgress) > stall {
			what := "starting"
			if len(st.restoring) > 0 {
				what = rec.String()
			}
			return fmt.Errorf("%w: no progress for %v while %s; the server's last line: %q",
				ErrNotReady, stall, what, strings.TrimSpace(st.last))
		}
		if len(st.restoring) == 0 {
			continue
		}
		if storeBytes < 0 {
			storeBytes = blockBytes(jsDir)
			rec.StoreBytes = storeBytes
			sl.announce()
			opts.Log.Info().Strs("streams", rec.Streams).Int64("store_bytes", storeBytes).Str("store_dir", jsDir).
				Msg("restoring the message store: JetStream is rebuilding streams from their files (after a crash, seconds per million keys); waiting while it makes progress")
			nextReport = now.Add(reportEvery)
		} else if now.After(nextReport) {
			ev := opts.Log.Info().Strs("streams", rec.Streams).Int("streams_restored", rec.Restored).
				Dur("elapsed", rec.Elapsed).Int64("store_bytes", rec.StoreBytes)
			if rec.ReadBytes >= 0 {
				ev = ev.Int64("read_bytes", rec.ReadBytes)
			}
			ev.Msg("restoring the message store")
			nextReport = now.Add(reportEvery)
		}
		if opts.OnRecovery != nil {
			opts.OnRecovery(rec)
		}
	}
	return nil
}

// blockBytes is the size of the message blocks of every stream under jsDir, the server's
// JetStream directory (<store>/jetstream/<account>/streams/<stream>/msgs/<n>.blk).
func blockBytes(jsDir string) int64 {
	blks, _ := filepath.Glob(filepath.Join(jsDir, "*", "streams", "*", "msgs", "*.blk"))
	var n int64
	for _, b := range blks {
		if fi, err := os.Stat(b); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// ioCount is a process's I/O counters: the bytes passed to its read and write calls, the page
// cache's included.
type ioCount struct{ read, written int64 }

func (c ioCount) total() int64 { return c.read + c.written }

// ioCounters reads this process's I/O counters from /proc/self/io (Linux); ok is false where
// the system does not provide them.
func ioCounters() (c ioCount, ok bool) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return ioCount{}, false
	}
	var seen int
	for line := range strings.Lines(string(b)) {
		name, val, found := strings.Cut(strings.TrimSpace(line), ": ")
		if !found {
			continue
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "rchar":
			c.read, seen = n, seen+1
		case "wchar":
			c.written, seen = n, seen+1
		}
	}
	return c, seen == 2
}
