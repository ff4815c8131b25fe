package httpapi

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// hdrBodyOverLimit marks, between fasthttp's header hook and readBody, a request whose
// Content-Length is over the body limit; hdrBareLF one whose header section holds a bare LF.
// A client's own copies are dropped first.
const (
	hdrBodyOverLimit = "X-Oncegate-Body-Over-Limit"
	hdrBareLF        = "X-Oncegate-Bare-LF"
)

// headerReceived runs when fasthttp has read a request's header, before any of its body.
// The server streams request bodies (readBody reads each into a buffer of its declared size;
// fasthttp's own reading rounded the buffer up to a power of two: 8 MiB for a body just over
// 4 MiB, held while the request ran). A streaming fasthttp still reads up to 8 KiB of a body
// before any handler runs, also of a body over the limit, so a client that sends the header of
// an oversized request and waits would get 408 at the read timeout instead of 413 at once: its
// Content-Length is set to 0 here (nothing is read) and the request marked for readBody, which
// answers 413 and closes the connection (the body's bytes are still on it).
//
// A request whose header section holds a bare LF (an LF not preceded by CR) is marked the same
// way and answered 400 malformed_request by readBody, before any handler, its body unread.
// fasthttp reads a bare LF as a line end, so "X-A: a<LF>X-B: b" arrives as two valid headers
// and a folded or LF-only header as if it were well formed: what a proxy in front read as one
// header this server would read as another, so the request is refused whole (issue 34; the
// README promised it). The raw header section is the one place the LF can still be seen.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	h.Del(hdrBodyOverLimit)
	h.Del(hdrBareLF)
	switch {
	case hasBareLF(h.RawHeaders()):
		h.SetContentLength(0)
		h.Set(hdrBareLF, "1")
	case h.ContentLength() > s.bodyLimit:
		h.SetContentLength(0)
		h.Set(hdrBodyOverLimit, "1")
	}
	return fasthttp.RequestConfig{} // the server's limits
}

// hasBareLF reports whether b holds an LF that is not the end of a CRLF.
func hasBareLF(b []byte) bool {
	for i, c := range b {
		if c == '\n' && (i == 0 || b[i-1] != '\r') {
			return true
		}
	}
	return false
}

// readBody is the first middleware: it reads the request's body, whatever the route, into one
// buffer of the body's declared size (a chunked body: grown up to the limit), so that no
// handler meets a stream and no route can leave a body's bytes on the connection to be read
// as the next request. A body it cannot read whole ends the connection after the answer:
// 413 over the limit, 408 when the read timeout passes first, 400 otherwise; so does a header
// section with a bare LF (400 malformed_request, marked by headerReceived).
func (s *Server) readBody(c *fiber.Ctx) error {
	req := c.Request()
	if len(req.Header.Peek(hdrBareLF)) > 0 {
		req.Header.Del(hdrBareLF)
		c.Context().SetConnectionClose()
		return errMalformed
	}
	if len(req.Header.Peek(hdrBodyOverLimit)) > 0 {
		req.Header.Del(hdrBodyOverLimit)
		c.Context().SetConnectionClose()
		return errBodyTooLarge
	}
	if !req.IsBodyStream() {
		return c.Next()
	}
	body, err := readAll(req.BodyStream(), req.Header.ContentLength(), s.bodyLimit)
	_ = req.CloseBodyStream() // releases fasthttp's stream; its error is the read's, handled below
	if err != nil {
		c.Context().SetConnectionClose()
		return err
	}
	req.SwapBody(body)
	return c.Next()
}

// readAll reads a body of declared bytes (-1: chunked, up to limit) from r.
func readAll(r io.Reader, declared, limit int) ([]byte, error) {
	var (
		body []byte
		err  error
	)
	if declared >= 0 {
		body = make([]byte, declared)
		_, err = io.ReadFull(r, body)
	} else {
		var b bytes.Buffer
		var n int64
		n, err = b.ReadFrom(io.LimitReader(r, int64(limit)+1))
		if err == nil && n > int64(limit) {
			return nil, errBodyTooLarge
		}
		body = b.Bytes()
	}
	var timeout interface{ Timeout() bool }
	switch {
	case err == nil:
		return body, nil
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return nil, errBodyTooLarge
	case errors.As(err, &timeout) && timeout.Timeout():
		return nil, errReadTimeout
	}
	return nil, fmt.Errorf("%w: %w", errMalformed, err)
}

// takeBody returns the request's body as the one copy the gateway keeps of it.
//
// A plain body is taken out of fasthttp (SwapBody), where readBody put it, rather than
// copied: a copy kept beside it doubled what a large request holds while it runs. Nothing
// reads the request's body after this (it is empty for fasthttp from here on).
//
// A gzip or deflate body is decoded here, bounded by the body limit: Fiber's Ctx.Body decodes
// without one, so a 600 KB gzip of a 600 MiB prompt took a node to 3.4 GB. Any other
// Content-Encoding is refused (415); so is more than one.
func (s *Server) takeBody(c *fiber.Ctx) ([]byte, error) {
	enc := strings.ToLower(strings.TrimSpace(string(c.Request().Header.ContentEncoding())))
	switch enc {
	case "", "identity":
		return c.Request().SwapBody(nil), nil
	case "gzip", "x-gzip", "deflate":
		return decodeBody(enc, c.Request().Body(), s.bodyLimit)
	}
	return nil, errUnsupportedEncoding
}

// decodeBody decodes a gzip or deflate (zlib, as HTTP means it) body of at most limit bytes
// decoded: errBodyTooLarge beyond it, errBadEncoding when it is not what it says.
func decodeBody(enc string, raw []byte, limit int) ([]byte, error) {
	var (
		r   io.ReadCloser
		err error
	)
	if enc == "deflate" {
		r, err = zlib.NewReader(bytes.NewReader(raw))
	} else {
		r, err = gzip.NewReader(bytes.NewReader(raw))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadEncoding, err)
	}
	defer r.Close()
	var out bytes.Buffer
	n, err := out.ReadFrom(io.LimitReader(r, int64(limit)+1))
	switch {
	case err != nil && !errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: %w", errBadEncoding, err)
	case n > int64(limit):
		return nil, errBodyTooLarge
	}
	return out.Bytes(), nil
}
