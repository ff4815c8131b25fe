package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/jsdirect"
	"github.com/oncegate/oncegate/internal/jsleader"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/partition"
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

// directBatch is one batched direct get (jsdirect) of up to historyBatch chunks of subject
// from stream sequence from on: the chunks, the sequence of the last one (0: none), and
// whether the batch was full (more may follow).
func directBatch(ctx context.Context, nc *nats.Conn, subject string, from uint64) ([]Chunk, uint64, bool, error) {
	msgs, full, err := jsdirect.Batch(ctx, nc, jetstream.DefaultAPIPrefix, ChunksStreamOf(partition.OfSubject(subject)), subject, from, historyBatch)
	if err != nil {
		return nil, 0, false, err // a timeout is transient: the read is tried again
	}
	out := make([]Chunk, 0, len(msgs))
	var last uint64
	for _, m := range msgs {
		c, err := decodeChunk(m.Header, m.Data)
		if err != nil {
			return nil, 0, false, err
		}
		out, last = append(out, c), m.Seq
	}
	return out, last, full, nil
}

// leaderNext asks the stream's leader (jsleader) for the first chunk of subject at or after
// stream sequence from: the chunk and its sequence, or jetstream.ErrMsgNotFound.
func leaderNext(ctx context.Context, nc *nats.Conn, subject string, from uint64) (Chunk, uint64, error) {
	m, err := jsleader.Get(ctx, nc, jetstream.DefaultAPIPrefix, ChunksStreamOf(partition.OfSubject(subject)), jsleader.Request{Seq: from, NextBySubject: subject})
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
