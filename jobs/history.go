package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsleader"
	"github.com/oncegate/oncegate/internal/jsretry"
)

// historyBatch is how many chunks one direct get returns: a short answer's whole history in
// one request, a long stream's in a few.
const historyBatch = 512

// history reads the chunks CHUNKS holds on subject, in stream order, without a consumer: direct
// gets of historyBatch chunks (any replica answers), then, when fromLeader, message gets from the
// stream's leader past the last chunk read, until it has none. A replica can be behind the
// leader by the last few chunks; the leader holds every chunk stored when it answers, so what
// the history misses was stored after the leader's answer, and a feed registered before the
// read receives it live. On one server the replica is the leader, and fromLeader is false.
// Transient failures (an election) are tried again for jsretry.Window.
func history(ctx context.Context, nc *nats.Conn, subject string, fromLeader bool) ([]Chunk, error) {
	var out []Chunk
	var next uint64 // the stream sequence to read from (0: the subject's first)
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		for {
			got, last, full, err := directBatch(ctx, nc, subject, next)
			if err != nil {
				return err
			}
			out = append(out, got...)
			if last > 0 {
				next = last + 1
			}
			if !full {
				break
			}
		}
		for fromLeader {
			c, seq, err := leaderNext(ctx, nc, subject, next)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			out = append(out, c)
			next = seq + 1
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("jobs: read %s: %w", subject, err)
	}
	return out, nil
}

// directBatch is one batched direct get of up to historyBatch chunks of subject from stream
// sequence from on: the chunks, the sequence of the last one (0: none), and whether the batch
// was full (more may follow).
func directBatch(ctx context.Context, nc *nats.Conn, subject string, from uint64) ([]Chunk, uint64, bool, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, 0, false, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = sub.SetPendingLimits(-1, -1)
	req, _ := json.Marshal(struct {
		Seq     uint64 `json:"seq,omitempty"`
		NextFor string `json:"next_by_subj"`
		Batch   int    `json:"batch"`
	}{from, subject, historyBatch})
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+ChunksStream, inbox, req); err != nil {
		return nil, 0, false, err
	}
	var out []Chunk
	var last uint64
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, 0, false, err // a timeout is transient: the read is tried again
		}
		if status := m.Header.Get("Status"); len(m.Data) == 0 && status != "" {
			switch status {
			case "503":
				return nil, 0, false, nats.ErrNoResponders
			case "404": // nothing (more) on the subject
				return out, last, false, nil
			case "204": // the end of the batch
				return out, last, len(out) == historyBatch, nil
			default:
				return nil, 0, false, fmt.Errorf("jobs: direct get: %s %s", status, m.Header.Get("Description"))
			}
		}
		c, err := decodeChunk(m.Header, m.Data)
		if err != nil {
			return nil, 0, false, err
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, 0, false, fmt.Errorf("jobs: direct get: sequence %q: %w", m.Header.Get(jetstream.SequenceHeader), err)
		}
		out, last = append(out, c), seq
	}
}

// leaderNext asks the stream's leader (jsleader) for the first chunk of subject at or after
// stream sequence from: the chunk and its sequence, or jetstream.ErrMsgNotFound.
func leaderNext(ctx context.Context, nc *nats.Conn, subject string, from uint64) (Chunk, uint64, error) {
	m, err := jsleader.Get(ctx, nc, jetstream.DefaultAPIPrefix, ChunksStream, jsleader.Request{Seq: from, NextBySubject: subject})
	if err != nil {
		return Chunk{}, 0, err
	}
	var h nats.Header
	if len(m.Headers) > 0 {
		if h, err = nats.DecodeHeadersMsg(m.Headers); err != nil {
			return Chunk{}, 0, fmt.Errorf("jobs: leader's answer: headers: %w", err)
		}
	}
	c, err := decodeChunk(h, m.Data)
	return c, m.Seq, err
}
