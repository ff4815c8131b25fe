// Package jsleader reads a stream's message from the stream's leader: the stream API's message
// get ($JS.API.STREAM.MSG.GET), which only the leader answers, unlike a direct get that any
// replica (possibly one behind the leader) answers. jetstream.Stream.GetMsg turns into a direct
// get on a stream that allows them, so the gateway's reads that must see every write the
// stream acknowledged, or must prove that a leader serves the stream, ask here.
package jsleader

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Request is what to read: the last message on a subject, or the first at or after a
// sequence (on a subject, when NextBySubject is set).
type Request struct {
	Seq           uint64 `json:"seq,omitempty"`
	LastBySubject string `json:"last_by_subj,omitempty"`
	NextBySubject string `json:"next_by_subj,omitempty"`
}

// Msg is a message as the stream API's get returns it.
type Msg struct {
	Subject string    `json:"subject"`
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"` // when the stream stored it (the server's clock)
	Headers []byte    `json:"hdrs"` // as on the wire (nats.DecodeHeadersMsg reads them)
	Data    []byte    `json:"data"`
}

// Get asks stream's leader for req under the JetStream API prefix apiPrefix ("$JS.API."
// unless a domain or prefix is set). No such message is jetstream.ErrMsgNotFound; any other
// refusal is the server's *jetstream.APIError (jsretry classifies it), a lost answer the
// request's error.
func Get(ctx context.Context, nc *nats.Conn, apiPrefix, stream string, req Request) (*Msg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	m, err := nc.RequestWithContext(ctx, apiPrefix+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *Msg                `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("jsleader: %s's answer: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, fmt.Errorf("jsleader: %s's answer holds no message", stream)
	}
	return resp.Message, nil
}

// APIPrefix is the subject prefix of js's JetStream API requests, as nats.go makes it (a
// jetstream.NewWithAPIPrefix prefix, a domain's, or $JS.API.), for Get's requests.
func APIPrefix(js jetstream.JetStream) string {
	switch o := js.Options(); {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return jetstream.DefaultAPIPrefix
}
