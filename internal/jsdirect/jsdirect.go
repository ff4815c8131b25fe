// Package jsdirect reads a run of a stream's messages in one request: the batched direct get
// ($JS.API.DIRECT.GET.<stream> with next_by_subj and batch, nats-server 2.11+) of a stream that
// allows direct gets. Any replica answers, usually the one on the asker's own server, with no
// Raft and no route hop; it may be behind the leader by the last few writes, so a reader that
// must see every acknowledged write reads past the batch from the leader (jsleader).
package jsdirect

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Msg is one message of a batch.
type Msg struct {
	Subject string
	Seq     uint64
	Header  nats.Header
	Data    []byte
}

// Batch asks any replica of stream, under the JetStream API prefix apiPrefix, for up to n
// messages on subject (a filter: wildcards allowed; "": every subject, from a sequence above 0)
// at or after stream sequence from (0: the subject's first). A wildcard filter costs the
// replica a walk of the stream's matching subjects per batch (its pending count): a reader of
// a whole stream with many subjects passes "". full reports that more may follow the batch: it holds n messages, or the
// replica cut it at the bytes it sends in one answer (its max_pending, 64 MB by default) with
// messages left. A replica without the stream answers nats.ErrNoResponders; a timeout is the
// context's error.
func Batch(ctx context.Context, nc *nats.Conn, apiPrefix, stream, subject string, from uint64, n int) (msgs []Msg, full bool, err error) {
	return BatchMax(ctx, nc, apiPrefix, stream, subject, from, n, 0)
}

// BatchMax is Batch with the batch cut once it holds maxBytes (0: the replica's max_pending):
// a reader of large messages bounds what one answer holds in memory.
func BatchMax(ctx context.Context, nc *nats.Conn, apiPrefix, stream, subject string, from uint64, n, maxBytes int) (msgs []Msg, full bool, err error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	req, _ := json.Marshal(struct {
		Seq     uint64 `json:"seq,omitempty"`
		NextFor string `json:"next_by_subj"`
		Batch   int    `json:"batch"`
		Max     int    `json:"max_bytes,omitempty"`
	}{from, subject, n, maxBytes})
	if err := nc.PublishRequest(apiPrefix+"DIRECT.GET."+stream, inbox, req); err != nil {
		return nil, false, err
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, false, err
		}
		if status := m.Header.Get("Status"); len(m.Data) == 0 && status != "" {
			switch status {
			case "503":
				return nil, false, nats.ErrNoResponders
			case "404": // nothing (more) on the subject
				return msgs, false, nil
			case "204": // the end of the batch: the messages left after it on the replica
				pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
				return msgs, len(msgs) >= n || (len(msgs) > 0 && pending > 0), nil
			default:
				return nil, false, fmt.Errorf("jsdirect: %s: %s %s", stream, status, m.Header.Get("Description"))
			}
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("jsdirect: %s: sequence %q: %w", stream, m.Header.Get(jetstream.SequenceHeader), err)
		}
		msgs = append(msgs, Msg{Subject: m.Header.Get(jetstream.SubjectHeader), Seq: seq, Header: m.Header, Data: m.Data})
	}
}
