package mockllm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
)

var (
	// errBodyClosed is what reads of a closed response body return (the
	// same text net/http uses).
	errBodyClosed = errors.New("http: read on closed response body")
	// errHandlerDone cancels the handler's context once it has returned,
	// like net/http does.
	errHandlerDone = errors.New("mockllm: handler returned")
)

// RoundTripper returns an in-memory http.RoundTripper that serves every
// request with s, whatever its URL host. ServeHTTP runs in a goroutine and
// the response is returned as soon as the handler commits it (first Write,
// Flush or WriteHeader, or when it returns); the body is an io.Pipe, so
// streaming works without a network listener and each handler Write blocks
// until the client has read it.
//
// Cancelling req.Context() cancels the handler's r.Context(), fails its
// writes and makes body reads return the context error. Closing the
// response body does the same and waits for the handler to return. A
// handler that aborts with panic(http.ErrAbortHandler) makes body reads
// return io.ErrUnexpectedEOF (or RoundTrip return it, before the headers).
// No goroutine outlives the request: once the body is read to EOF, closed,
// or the request context is done, the handler goroutine is gone or going.
func (s *Server) RoundTripper() http.RoundTripper { return &transport{h: s} }

type transport struct{ h http.Handler }

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var bodyOnce sync.Once
	closeReqBody := func() {
		bodyOnce.Do(func() {
			if req.Body != nil {
				_ = req.Body.Close()
			}
		})
	}
	if req.URL == nil {
		closeReqBody()
		return nil, errors.New("mockllm: nil Request.URL")
	}
	if req.Header == nil {
		closeReqBody()
		return nil, errors.New("mockllm: nil Request.Header")
	}
	if err := req.Context().Err(); err != nil {
		closeReqBody()
		return nil, err
	}

	ctx, cancel := context.WithCancelCause(req.Context())
	sreq := serverRequest(ctx, req)
	pr, pw := io.Pipe()
	rw := &rtWriter{header: make(http.Header), pw: pw, req: req, ready: make(chan struct{})}

	// Whatever ends the request early (client cancel, Body.Close) fails
	// the handler's pending and future writes and the client's reads.
	stop := context.AfterFunc(ctx, func() {
		_ = pw.CloseWithError(context.Cause(ctx))
		closeReqBody()
	})

	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			p := recover()
			stop()
			if p != nil {
				err := io.ErrUnexpectedEOF
				if p != http.ErrAbortHandler {
					err = fmt.Errorf("mockllm: handler panic: %v", p)
				}
				rw.fail(err)
				_ = pw.CloseWithError(err)
			} else {
				rw.commit()
				if cause := context.Cause(ctx); cause != nil {
					// The handler returned because the request was
					// cancelled (or the body closed): what it wrote is
					// not the whole response, so no clean EOF.
					_ = pw.CloseWithError(cause)
				} else {
					_ = pw.Close()
				}
			}
			closeReqBody()
			cancel(errHandlerDone)
		}()
		t.h.ServeHTTP(rw, sreq)
	}()

	select {
	case <-rw.ready:
	case <-ctx.Done():
		if err := req.Context().Err(); err != nil {
			// The client gave up before the headers arrived. The
			// handler sees a cancelled context and failing writes.
			<-done
			return nil, err
		}
		// Only the handler's own completion cancels ctx otherwise, and it
		// commits the response first.
		<-rw.ready
	}
	if rw.resp == nil {
		<-done
		return nil, rw.err
	}
	body := &rtBody{pr: pr, cancel: cancel, done: done}
	if err := req.Context().Err(); err != nil {
		// Cancelled while the headers were being committed: report the
		// cancellation rather than a response whose body would fail.
		_ = body.Close()
		return nil, err
	}
	resp := rw.resp
	resp.Body = body
	return resp, nil
}

// serverRequest turns a client request into what a handler would receive
// from net/http's server.
func serverRequest(ctx context.Context, req *http.Request) *http.Request {
	r := req.Clone(ctx)
	if r.Body == nil {
		r.Body = http.NoBody
	}
	if r.Method == "" {
		r.Method = http.MethodGet
	}
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	r.RequestURI = req.URL.RequestURI()
	if r.Host == "" {
		r.Host = req.URL.Host
	}
	r.RemoteAddr = "pipe"
	r.Close = false
	r.GetBody = nil
	return r
}

// rtWriter is the handler side of the in-memory transport. Its methods are
// called from the handler goroutine only; RoundTrip reads resp and err after
// ready is closed.
type rtWriter struct {
	header    http.Header
	pw        *io.PipeWriter
	req       *http.Request
	ready     chan struct{}
	committed bool
	status    int
	resp      *http.Response
	err       error
}

func (w *rtWriter) Header() http.Header { return w.header }

func (w *rtWriter) WriteHeader(code int) {
	if w.committed {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		return // informational responses are not delivered
	}
	w.status = code
	w.commit()
}

func (w *rtWriter) Write(p []byte) (int, error) {
	if !w.committed {
		if w.header.Get("Content-Type") == "" && w.header.Get("Content-Encoding") == "" && len(p) > 0 {
			w.header.Set("Content-Type", http.DetectContentType(p))
		}
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil // an empty pipe write would block for a reader
	}
	return w.pw.Write(p)
}

// Flush commits the headers; the data itself is never buffered.
func (w *rtWriter) Flush() { _ = w.FlushError() }

// FlushError is what http.ResponseController.Flush calls.
func (w *rtWriter) FlushError() error {
	if !w.committed {
		w.WriteHeader(http.StatusOK)
	}
	return nil
}

func (w *rtWriter) commit() {
	if w.committed {
		return
	}
	w.committed = true
	if w.status == 0 {
		w.status = http.StatusOK
	}
	h := w.header.Clone()
	cl := int64(-1)
	if v := h.Get("Content-Length"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			cl = n
		}
	}
	text := http.StatusText(w.status)
	if text == "" {
		text = "status code " + strconv.Itoa(w.status)
	}
	w.resp = &http.Response{
		Status:        strconv.Itoa(w.status) + " " + text,
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		ContentLength: cl,
		Request:       w.req,
	}
	close(w.ready)
}

// fail reports err to RoundTrip if the headers were not committed yet.
func (w *rtWriter) fail(err error) {
	if w.committed {
		return
	}
	w.committed = true
	w.err = err
	close(w.ready)
}

// rtBody is the client side of the in-memory transport.
type rtBody struct {
	pr     *io.PipeReader
	cancel context.CancelCauseFunc
	done   <-chan struct{}
	closed atomic.Bool
}

func (b *rtBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errBodyClosed
	}
	return b.pr.Read(p)
}

// Close stops the handler (its context is cancelled and its writes fail)
// and waits for it to return.
func (b *rtBody) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.cancel(errBodyClosed)
	_ = b.pr.CloseWithError(errBodyClosed)
	<-b.done
	return nil
}
