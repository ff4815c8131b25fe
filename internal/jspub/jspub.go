// Package jspub publishes a message to a JetStream stream and waits for its ack, as
// jetstream's PublishMsg does, but reads the ack's usual shape without encoding/json: decoding
// the ack by reflection was 60 % of a synchronous publish's client-side CPU and 4.6 % of the
// gateway's at c=64 (BENCHMARKS.md, round 4). Any other reply (an error, a field this package
// does not know) is decoded by encoding/json exactly as jetstream does, so the errors are
// jetstream's: *jetstream.APIError (wrapped as "nats: …"), jetstream.ErrInvalidJSAck and
// jetstream.ErrNoStreamResponse.
package jspub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The defaults of jetstream's PublishMsg: a publish without a deadline gets defaultTimeout, and
// "no responders" (a stream's leader moving) is asked again retryAttempts times.
const (
	defaultTimeout = 5 * time.Second
	retryWait      = jetstream.DefaultPubRetryWait
	retryAttempts  = jetstream.DefaultPubRetryAttempts
)

// Publish sends m on nc and returns the stream's ack. m's headers carry what jetstream's
// publish options would set (jetstream.MsgIDHeader, jetstream.ExpectedLastSubjSeqHeader, …).
func Publish(ctx context.Context, nc *nats.Conn, m *nats.Msg) (*jetstream.PubAck, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultTimeout)
		defer cancel()
	}
	resp, err := nc.RequestMsgWithContext(ctx, m)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < retryAttempts; r++ {
		t := time.NewTimer(retryWait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		resp, err = nc.RequestMsgWithContext(ctx, m)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return nil, err
	}
	return ParseAck(resp.Data)
}

// ParseAck reads a stream's reply to a publish: its ack, or its error as jetstream returns it.
func ParseAck(data []byte) (*jetstream.PubAck, error) {
	if ack, ok := fastAck(data); ok {
		return ack, nil
	}
	return decodeAck(data)
}

// decodeAck is jetstream's own reading of a reply (publishMsg), for every shape.
func decodeAck(data []byte) (*jetstream.PubAck, error) {
	var r struct {
		Error *jetstream.APIError `json:"error,omitempty"`
		*jetstream.PubAck
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, jetstream.ErrInvalidJSAck
	}
	if r.Error != nil {
		return nil, fmt.Errorf("nats: %w", r.Error)
	}
	if r.PubAck == nil || r.PubAck.Stream == "" {
		return nil, jetstream.ErrInvalidJSAck
	}
	return r.PubAck, nil
}

// fastAck reads the shapes nats-server writes for a stored or duplicate message (stream.go's
// pubAck template): {"stream":S[,"domain":D],"seq":N[,"duplicate": true]} with names of plain
// printable ASCII. Anything else is left to encoding/json (ok false).
func fastAck(b []byte) (ack *jetstream.PubAck, ok bool) {
	var stream, domain string
	if b, ok = bytes.CutPrefix(b, []byte(`{"stream":"`)); !ok {
		return nil, false
	}
	if stream, b, ok = plainString(b); !ok || stream == "" {
		return nil, false
	}
	if rest, found := bytes.CutPrefix(b, []byte(`,"domain":"`)); found {
		if domain, b, ok = plainString(rest); !ok {
			return nil, false
		}
	}
	if b, ok = bytes.CutPrefix(b, []byte(`,"seq":`)); !ok {
		return nil, false
	}
	seq, b, ok := number(b)
	if !ok {
		return nil, false
	}
	dup := false
	if rest, found := bytes.CutPrefix(b, []byte(`,"duplicate": true`)); found {
		b, dup = rest, true
	} else if rest, found := bytes.CutPrefix(b, []byte(`,"duplicate":true`)); found {
		b, dup = rest, true
	}
	if string(b) != "}" {
		return nil, false
	}
	return &jetstream.PubAck{Stream: stream, Sequence: seq, Duplicate: dup, Domain: domain}, true
}

// plainString reads a string body up to its closing quote: printable ASCII with no escape (what
// JSON decodes to itself); the rest of b follows the quote.
func plainString(b []byte) (s string, rest []byte, ok bool) {
	for i, c := range b {
		switch {
		case c == '"':
			return string(b[:i]), b[i+1:], true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return "", b, false
		}
	}
	return "", b, false
}

// number reads a JSON integer that fits a uint64: no sign, no leading zero, no fraction.
func number(b []byte) (n uint64, rest []byte, ok bool) {
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		d := uint64(b[i] - '0')
		if n > (^uint64(0)-d)/10 {
			return 0, b, false
		}
		n = n*10 + d
		i++
	}
	if i == 0 || (i > 1 && b[0] == '0') {
		return 0, b, false
	}
	return n, b[i:], true
}
