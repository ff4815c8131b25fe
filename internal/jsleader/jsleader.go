// Package jsleader reads a stream's message from the stream's leader: the stream API's message
// get ($JS.API.STREAM.MSG.GET), which only the leader answers, unlike a direct get that any
// replica (possibly one behind the leader) answers. jetstream.Stream.GetMsg turns into a direct
// get on a stream that allows them, so the gateway's reads that must see every write the
// stream acknowledged, or must prove that a leader serves the stream, ask here.
package jsleader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsretry"
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
	case resp.Error != nil && jsretry.ClusterNotAvailable(resp.Error) && req.LastBySubject != "":
		// The meta group has no leader (a partitioned cluster that lost one partition's
		// servers lost the meta group's majority too, three of six), while this stream's
		// group may well have one and take writes.
		return lastByProbe(ctx, nc, apiPrefix, stream, req.LastBySubject, resp.Error)
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

// probeSeq is the expected last sequence of lastByProbe's publish: one no subject reaches.
const probeSeq = math.MaxUint64

// lastByProbe reads the last message on subject from the stream's leader without the stream
// API: a publish expecting the subject's last sequence to be probeSeq is refused by the leader
// (only the leader answers a publish, and a refused one stores nothing) with the subject's
// actual last sequence, which a direct get then reads from any replica (one behind the leader
// answers "not found" or an older message until it has caught up, and is asked again). A stream
// that allows no direct get, or a leader that cannot be reached, leaves cause as the answer.
func lastByProbe(ctx context.Context, nc *nats.Conn, apiPrefix, stream, subject string, cause error) (*Msg, error) {
	probe := nats.NewMsg(subject)
	probe.Header.Set(jetstream.ExpectedStreamHeader, stream)
	probe.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(probeSeq, 10))
	ack, err := nc.RequestMsgWithContext(ctx, probe)
	if err != nil {
		return nil, fmt.Errorf("jsleader: %s: %w (probing its leader: %w)", stream, cause, err)
	}
	var pa struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(ack.Data, &pa); err != nil || pa.Error == nil {
		// Not a refusal: nothing is stored at probeSeq, so this cannot be an acknowledgement.
		return nil, fmt.Errorf("jsleader: %s: %w (its leader's answer to a probe: %q)", stream, cause, ack.Data)
	}
	last, ok := lastSequence(pa.Error)
	if !ok {
		return nil, fmt.Errorf("jsleader: %s: %w (its leader refused a probe: %w)", stream, cause, pa.Error)
	}
	if last == 0 {
		return nil, jetstream.ErrMsgNotFound
	}
	for {
		m, err := directLast(ctx, nc, apiPrefix, stream, subject)
		switch {
		case err != nil && !errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, fmt.Errorf("jsleader: %s: %w (reading sequence %d: %w)", stream, cause, last, err)
		case err == nil && m.Seq >= last:
			return m, nil
		}
		select { // a replica behind the leader answered: ask again
		case <-ctx.Done():
			return nil, fmt.Errorf("jsleader: %s: %w (no replica had sequence %d: %w)", stream, cause, last, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lastSequence is the subject's last sequence a "wrong last sequence: N" refusal names.
func lastSequence(e *jetstream.APIError) (uint64, bool) {
	if e.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return 0, false
	}
	_, n, ok := strings.Cut(e.Description, "wrong last sequence: ")
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseUint(strings.TrimSpace(n), 10, 64)
	return seq, err == nil
}

// directLast is a direct get of the last message on subject, from whichever replica answers.
func directLast(ctx context.Context, nc *nats.Conn, apiPrefix, stream, subject string) (*Msg, error) {
	body, err := json.Marshal(Request{LastBySubject: subject})
	if err != nil {
		return nil, err
	}
	m, err := nc.RequestWithContext(ctx, apiPrefix+"DIRECT.GET."+stream, body)
	if err != nil {
		return nil, err
	}
	if status := m.Header.Get("Status"); len(m.Data) == 0 && status != "" {
		if status == "404" {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, fmt.Errorf("direct get: %s %s", status, m.Header.Get("Description"))
	}
	seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("direct get: sequence %q: %w", m.Header.Get(jetstream.SequenceHeader), err)
	}
	at, _ := time.Parse(time.RFC3339Nano, m.Header.Get(jetstream.TimeStampHeaer))
	return &Msg{Subject: m.Header.Get(jetstream.SubjectHeader), Seq: seq, Time: at, Headers: wireHeaders(m.Header), Data: m.Data}, nil
}

// directHeaders are the headers a direct get adds to the stored message's.
var directHeaders = []string{jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer, jetstream.SubjectHeader, "Nats-Last-Sequence", "Nats-Num-Pending", "Nats-UpTo-Sequence"}

// wireHeaders is h, less what a direct get adds, as the stream API's get returns headers: on
// the wire ("NATS/1.0" and the lines), nil when none is left.
func wireHeaders(h nats.Header) []byte {
	var b strings.Builder
	for k, vs := range h {
		if slices.Contains(directHeaders, k) {
			continue
		}
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return []byte("NATS/1.0\r\n" + b.String() + "\r\n")
}
