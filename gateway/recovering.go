package gateway

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"time"

	"github.com/oncegate/oncegate/httpapi"
	"github.com/oncegate/oncegate/internal/natsrv"
)

// recoveryPort is the API's port while the embedded store is restored at start
// (httpapi.Recovering): bound at the restore's first report, so that a liveness probe finds the
// process alive and a readiness probe or a client hears "recovering" instead of nothing, and
// closed just before the API binds the port (listenAPI).
type recoveryPort struct {
	srv  *httpapi.Recovering
	lent *lentListener // the kept random port (g.ln), lent to srv; nil when srv bound its own
	done chan error
}

// onRecovery is natsrv.Options.OnRecovery for an API node: the first report opens the port,
// every report updates what /readyz says. It runs in Start's goroutine.
func (g *Gateway) onRecovery(rec natsrv.Recovery) {
	if g.recovery == nil {
		g.openRecoveryPort()
	}
	if g.recovery != nil {
		g.recovery.srv.Set(rec)
	}
}

// openRecoveryPort serves httpapi.Recovering on the API's port. A port that cannot be had is
// logged, not fatal: the start goes on as it would without.
func (g *Gateway) openRecoveryPort() {
	p := &recoveryPort{srv: httpapi.NewRecovering(), done: make(chan error, 1)}
	var ln net.Listener
	if tl, ok := g.ln.(*net.TCPListener); ok {
		p.lent = &lentListener{TCPListener: tl}
		ln = p.lent
	} else {
		var err error
		if ln, err = net.Listen("tcp", g.cfg.Listen); err != nil {
			g.log.Warn().Err(err).Str("listen", g.cfg.Listen).Msg("the API's port cannot answer while the message store is restored")
			return
		}
	}
	if g.tlsConf != nil {
		ln = tls.NewListener(ln, g.tlsConf)
	}
	go func() { p.done <- p.srv.Serve(ln) }()
	g.recovery = p
	g.log.Info().Str("listen", g.cfg.Listen).Msg("the API's port answers 503 recovering (GET /healthz 200) until the store is restored and the API serves")
}

// closeRecoveryPort stops answering on the API's port (nothing to do when it was never open).
func (g *Gateway) closeRecoveryPort() {
	p := g.recovery
	if p == nil {
		return
	}
	g.recovery = nil
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		g.log.Warn().Err(err).Msg("closing the API's recovering port")
	}
	if err := <-p.done; err != nil {
		g.log.Warn().Err(err).Msg("the API's recovering port")
	}
	if p.lent != nil {
		p.lent.giveBack()
	}
}

// lentListener lends a listener the gateway keeps (a random port, bound at start) to the
// recovering server: its Close ends the server's Accept with a deadline, and leaves the port
// bound for the API.
type lentListener struct {
	*net.TCPListener
	closed atomic.Bool
}

func (l *lentListener) Accept() (net.Conn, error) {
	c, err := l.TCPListener.Accept()
	if err != nil && l.closed.Load() {
		return nil, net.ErrClosed
	}
	return c, err
}

func (l *lentListener) Close() error {
	l.closed.Store(true)
	return l.SetDeadline(time.Now())
}

// giveBack makes the listener accept again, for the API.
// (A listener closed meanwhile fails the API's serve, which says so.)
func (l *lentListener) giveBack() { _ = l.SetDeadline(time.Time{}) }
