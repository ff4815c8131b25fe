// Package natsrv starts the embedded nats-server with JetStream that oncegate runs on by default,
// and connects to it (in-process, no network port) or to an external NATS.
//
// Durability: the embedded server runs with `sync_interval: always` semantics (every JetStream
// file-store write is fsynced before it is acknowledged) unless a sync interval is configured.
// Only the streams that hold state use file storage (the IDEM key-value bucket, later the
// ledger); JOBS and CHUNKS are memory streams that the key records can re-drive, so they pay no
// fsync. On this class of machine a synced write costs ~0.2-0.3 ms and the disk takes ~4k
// syncs/s; a request makes two synced writes on its critical path (claim and completion).
//
// One process per store: Start takes an advisory lock on the store directory (LockFile) and
// holds it until Shutdown, so a second gateway or the ledger CLI on the same data directory is
// refused with the holder's pid instead of opening the same files.
package natsrv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ErrNotReady is returned when the embedded server does not become ready in time.
var ErrNotReady = errors.New("natsrv: embedded server not ready")

// ErrListen is returned when the embedded server cannot listen on Options.Listen (the port is
// taken, the host is not local).
var ErrListen = errors.New("natsrv: listen")

// ErrStart is returned when the embedded server gave up starting (for example JetStream could
// not use its store); the error carries the server's own reason.
var ErrStart = errors.New("natsrv: embedded server did not start")

// Options configures the embedded server.
type Options struct {
	// StoreDir is where JetStream keeps its files.
	StoreDir string
	// Listen is an optional client listener ("127.0.0.1:4222"); empty means no network port.
	Listen string
	// SyncInterval is how often file-store writes are fsynced; 0 means every write (always).
	SyncInterval time.Duration
	// MaxPayload bounds one message (request records and stored results); default 8 MiB.
	MaxPayload int32
	// ServerName names the server; default "oncegate".
	ServerName string
}

// Server is a running embedded nats-server.
type Server struct {
	ns   *server.Server
	lock *dirLock
}

// Start takes the store directory's lock (see [LockFile]; [*LockedError] names the process
// that holds it), starts an embedded JetStream server and waits until it accepts connections.
// The lock is held until Shutdown.
func Start(ctx context.Context, opts Options) (_ *Server, err error) {
	so := &server.Options{
		ServerName:         opts.ServerName,
		JetStream:          true,
		StoreDir:           opts.StoreDir,
		DontListen:         opts.Listen == "",
		NoSigs:             true,
		NoLog:              true,
		MaxPayload:         opts.MaxPayload,
		JetStreamMaxMemory: 1 << 30,
		SyncAlways:         opts.SyncInterval == 0,
		SyncInterval:       opts.SyncInterval,
	}
	if so.ServerName == "" {
		so.ServerName = "oncegate"
	}
	if so.MaxPayload == 0 {
		so.MaxPayload = 8 << 20
	}
	// 2.15 caps consumers per stream at 1,000 by default; joiners create ordered consumers.
	so.JetStreamLimits.DefaultMaxConsumers = -1
	if opts.Listen != "" {
		host, port, err := net.SplitHostPort(opts.Listen)
		if err != nil {
			return nil, fmt.Errorf("natsrv: listen %q: %w", opts.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("natsrv: listen port %q: %w", port, err)
		}
		if p == 0 {
			// nats-server reads port 0 as its default 4222; ":0" means any free port here, as
			// it does for net.Listen (ClientURL says which).
			p = server.RANDOM_PORT
		}
		so.Host, so.Port = host, p
	}
	lock, err := lockDir(opts.StoreDir, so.ServerName)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.release()
		}
	}()
	ns, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("natsrv: new server: %w", err)
	}
	// The server reports why it gave up starting (port taken, JetStream store unusable) only
	// through its logger's Fatalf, and then never becomes ready: catch that reason instead of
	// waiting out the deadline and saying "not ready".
	fatal := &fatalLog{}
	ns.SetLoggerV2(fatal, false, false, false)
	go ns.Start()
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	for !ns.ReadyForConnections(50 * time.Millisecond) {
		ferr := fatal.err()
		if ferr == nil && time.Now().Before(deadline) {
			continue
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		var oe *net.OpError
		switch {
		case ferr == nil:
			return nil, ErrNotReady
		case opts.Listen != "" && errors.As(ferr, &oe) && oe.Op == "listen":
			return nil, fmt.Errorf("%w %s: %w", ErrListen, opts.Listen, oe.Err)
		default:
			return nil, fmt.Errorf("%w: %w", ErrStart, ferr)
		}
	}
	return &Server{ns: ns, lock: lock}, nil
}

// fatalLog is the embedded server's logger: it keeps the first fatal error and drops the rest
// (the server runs quiet, as with NoLog).
type fatalLog struct {
	mu    sync.Mutex
	fatal error
}

func (l *fatalLog) Fatalf(format string, v ...any) {
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

func (l *fatalLog) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}

func (*fatalLog) Noticef(string, ...any) {}
func (*fatalLog) Warnf(string, ...any)   {}
func (*fatalLog) Errorf(string, ...any)  {}
func (*fatalLog) Debugf(string, ...any)  {}
func (*fatalLog) Tracef(string, ...any)  {}

// startFailure is the server's fatal message, unwrapping to the errors it was given.
type startFailure struct {
	msg  string
	errs []error
}

func (e *startFailure) Error() string   { return e.msg }
func (e *startFailure) Unwrap() []error { return e.errs }

// Connect opens an in-process client connection to the embedded server.
func (s *Server) Connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect("", nats.InProcessServer(s.ns), nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("natsrv: connect in-process: %w", err)
	}
	return nc, nil
}

// ClientURL is the server's network URL when it listens, or "" when it does not.
func (s *Server) ClientURL() string {
	if s.ns.Addr() == nil {
		return ""
	}
	return s.ns.ClientURL()
}

// Shutdown stops the server, waits for it to finish, then releases the store directory's lock.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	s.lock.release()
}

// ConnectURL connects to an external NATS server or cluster.
func ConnectURL(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("natsrv: connect %s: %w", url, err)
	}
	return nc, nil
}
