// Package natsrv starts the embedded nats-server with JetStream that oncegate runs on by default,
// and connects to it (in-process, no network port) or to an external NATS.
//
// Durability: the embedded server runs with `sync_interval: always` semantics (every JetStream
// file-store write is fsynced before it is acknowledged) unless a sync interval is configured.
// Only the streams that hold state use file storage (the IDEM key-value bucket, later the
// ledger); JOBS and CHUNKS are memory streams that the key records can re-drive, so they pay no
// fsync. On this class of machine a synced write costs ~0.2-0.3 ms and the disk takes ~4k
// syncs/s; a request makes two synced writes on its critical path (claim and completion).
package natsrv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ErrNotReady is returned when the embedded server does not become ready in time.
var ErrNotReady = errors.New("natsrv: embedded server not ready")

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
	ns *server.Server
}

// Start starts an embedded JetStream server and waits until it accepts connections.
func Start(ctx context.Context, opts Options) (*Server, error) {
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
		so.Host, so.Port = host, p
	}
	ns, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("natsrv: new server: %w", err)
	}
	go ns.Start()
	deadline := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		deadline = time.Until(d)
	}
	if !ns.ReadyForConnections(deadline) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, ErrNotReady
	}
	return &Server{ns: ns}, nil
}

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

// Shutdown stops the server and waits for it to finish.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// ConnectURL connects to an external NATS server or cluster.
func ConnectURL(url, name string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("natsrv: connect %s: %w", url, err)
	}
	return nc, nil
}
