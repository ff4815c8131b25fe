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
)

// takeBody returns the request's body as the one copy the gateway keeps of it.
//
// A plain body is taken out of fasthttp (SwapBody) rather than copied: fasthttp would hand its
// buffer to the connection's next request once the handler returns, and a copy kept beside it
// doubled what a large request holds while it runs (fitted may still move a large one once, to
// drop the slack of fasthttp's buffer). Nothing reads the request's body after this (it is
// empty for fasthttp from here on).
//
// A gzip or deflate body is decoded here, bounded by the body limit: Fiber's Ctx.Body decodes
// without one, so a 600 KB gzip of a 600 MiB prompt took a node to 3.4 GB. Any other
// Content-Encoding is refused (415); so is more than one.
func (s *Server) takeBody(c *fiber.Ctx) ([]byte, error) {
	enc := strings.ToLower(strings.TrimSpace(string(c.Request().Header.ContentEncoding())))
	switch enc {
	case "", "identity":
		return fitted(c.Request().SwapBody(nil)), nil
	case "gzip", "x-gzip", "deflate":
		return decodeBody(enc, c.Request().Body(), s.app.Config().BodyLimit)
	}
	return nil, errUnsupportedEncoding
}

// fitted returns body in a buffer of its own size when fasthttp's has much more room: fasthttp
// reads a body into a buffer rounded up to a power of two (8 MiB for one just over 4 MiB), and
// that slack would stay allocated for as long as the request runs. Small bodies keep theirs.
func fitted(body []byte) []byte {
	if len(body) < fitAbove || cap(body)-len(body) < len(body)/4 {
		return body
	}
	return bytes.Clone(body)
}

// fitAbove is the body size from which fitted moves a body: below it the slack is small.
const fitAbove = 64 << 10

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
