package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/oncegate/oncegate/gateway"
)

// servePprof serves the profiling endpoints on a loopback address only. An address it cannot
// serve is a *gateway.StartError of the setting "pprof", printed as the one-line start failure.
func servePprof(addr string) (stop func(), err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, pprofError(err, "pprof %s: %v", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, pprofError(nil, "pprof %s: not a loopback address (the profiling endpoints have no authentication)", addr)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		cause := err
		var se *os.SyscallError
		if errors.As(err, &se) {
			cause = se.Err // "address already in use", without "listen tcp ADDR: bind:"
		}
		return nil, pprofError(err, "pprof listen %s: %v", addr, cause)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// pprofError is the start error of a --pprof address that cannot be served.
func pprofError(err error, format string, args ...any) error {
	return &gateway.StartError{Field: "pprof", Msg: fmt.Sprintf(format, args...), Err: err}
}
