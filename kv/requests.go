package kv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/oncegate/oncegate/internal/jspub"
	"github.com/oncegate/oncegate/internal/jsretry"
	"github.com/oncegate/oncegate/internal/replicas"
)

// RequestsStream holds the requests too large to ride in their record (above
// BucketConfig.InlineRequestMax), in pieces of requestPiece bytes, one message each on
// requests.<key>.<epoch>.<i> (a record stored before pieces has its request in one message on
// requests.<key>.<epoch>: Record.RequestPiece 0), written once after the claim and deleted once
// the record finishes. A piece that S2 compresses by an eighth or more is stored compressed,
// saying so in its Oncegate-Codec header (see hdrCodec).
//
// A record that carries its request pays for it on every write and every read: each lease
// renewal rewrites it, every reader (the worker, the API node's checks, a takeover) downloads
// it, and the server reads it back from disk for each. With 48 concurrent 4 MiB requests that
// was ~14 body-sized reads a request and a peak of 8-12× the bodies in the gateway's memory.
// A record that names its request instead stays a few hundred bytes; so does its job message
// (jobs.Job.RequestStored): the worker reads the request from here, so a large request is
// stored once in NATS, not also in JOBS (a memory stream, holding it until the job's ack).
//
// It is a file stream with the bucket's replicas: a re-drive after a crash needs it as much
// as the record. The subject carries the epoch of the claim that wrote it (a reclaim writes a
// new one), so deleting a finished epoch's request can never delete a later claim's.
const RequestsStream = "REQUESTS"

const (
	requestsPrefix = "requests."
	// requestsMinAge bounds how long a request whose deletion was lost (a crash between the
	// outcome's write and the delete) is kept: the bucket's TTL if longer. A record still
	// PENDING that long after its claim cannot be re-driven (its takeover fails it).
	requestsMinAge = 24 * time.Hour
	// DefaultInlineRequestMax is BucketConfig.InlineRequestMax when it is 0: a chat request
	// below it (nearly all) costs no extra write.
	DefaultInlineRequestMax = 64 << 10
	// requestPiece is the size of a stored request's pieces. Stored whole, a 4 MiB request
	// cost the embedded server two buffers of its size on top of the gateway's own: the
	// message assembled across reads of the connection (its read buffer is at most 64 KiB) and
	// its copy queued to the stream. A piece is parsed where it lies in the read buffer and
	// copied 32 KiB at a time: 48 concurrent 4 MiB requests allocated 3.2× the bodies, now
	// 2.4×, and peaked at 1.9-2.1× instead of 2.2-2.5× (BENCHMARKS.md, memory per request
	// round 5).
	requestPiece = 32 << 10
	// piecesInFlight is how many pieces of one request are written or read at once.
	piecesInFlight = 4
	// hdrCodec is the header of a piece stored compressed, codecS2 its one value: the piece is
	// an S2 block (github.com/klauspost/compress/s2) that decodes to the piece's size. A piece
	// without it is stored as sent. Everything the embedded server does with a piece (its copy
	// of each inbound message, the block it is written to and loaded from, a replica's copy)
	// scales with the stored size: text, what prompts are made of, stores at about half
	// (BENCHMARKS.md, memory per request round 6), and random bytes as they are.
	hdrCodec = "Oncegate-Codec"
	codecS2  = "s2"
)

// newPieceBufs is the pool of buffers pieces are compressed into (*[]byte), each of S2's bound
// on the encoded size of a piece.
func newPieceBufs() *sync.Pool {
	n := s2.MaxEncodedLen(requestPiece)
	return &sync.Pool{New: func() any {
		b := make([]byte, n)
		return &b
	}}
}

// ErrRequestLost is returned when a record names a stored request that REQUESTS no longer
// holds: its claim's node died before it was written (no job was published then), or it
// outlived the stream's age.
var ErrRequestLost = errors.New("kv: the record's stored request is gone")

func openRequests(ctx context.Context, js jetstream.JetStream, nm names, ttl time.Duration, n int, placement *jetstream.Placement) (jetstream.Stream, error) {
	st, err := replicas.Ensure(ctx, js, jetstream.StreamConfig{
		Name:      nm.requests,
		Subjects:  []string{nm.requestsPrefix + ">"},
		Placement: placement,
		Storage:   jetstream.FileStorage,
		MaxAge:    max(ttl, requestsMinAge),
		Discard:   jetstream.DiscardOld,
		Replicas:  n,
		// A direct get answers with the message as stored; the stream API's get wraps it in
		// JSON as base64, costing two more body-sized buffers on each side. Any replica answers
		// one, so a miss is asked of the leader again before a request is called lost (Request).
		AllowDirect: true,
	})
	if err != nil {
		return nil, fmt.Errorf("kv: open requests %s: %w", nm.requests, err)
	}
	return st, nil
}

func (s *Store) requestSubject(key string, epoch int) string {
	return s.names.requestsPrefix + key + "." + strconv.Itoa(epoch)
}

// StoresRequest reports whether a request of n bytes is stored in REQUESTS rather than in
// its record.
func (s *Store) StoresRequest(n int) bool { return n > s.inlineMax }

// PutRequest stores rec's request for its key (rec.RequestAt names the epoch); call it after
// the claim and before the job is published. Retried like Claim (a retry may store a piece
// twice: both copies are the same bytes, and a read takes the last).
func (s *Store) PutRequest(ctx context.Context, key string, rec *Record) error {
	if rec.RequestAt == 0 {
		return nil
	}
	if rec.RequestPiece > 0 && len(rec.Request) != rec.RequestBytes {
		return fmt.Errorf("kv: store request of %s: %d bytes, the record says %d", key, len(rec.Request), rec.RequestBytes)
	}
	// One request at a time, so that its pieces lie together in REQUESTS' blocks: interleaved
	// with the pieces of every request stored beside it, one request's drop made the server
	// load each block the burst wrote (8 MiB each) to find its pieces; 48 concurrent 4 MiB
	// requests then peaked at 2.9-3.0× the bodies, against 1.9-2.1× stored one at a time.
	select {
	case s.storing <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("kv: store request of %s: %w", key, ctx.Err())
	}
	defer func() { <-s.storing }()
	err := jsretry.Within(ctx, func(ctx context.Context) error {
		return eachPiece(ctx, rec, func(ctx context.Context, i, lo, hi int) error {
			msg := &nats.Msg{Subject: s.pieceSubject(key, rec, i), Data: rec.Request[lo:hi]}
			if rec.RequestPiece == 0 {
				_, err := jspub.Publish(ctx, s.js.Conn(), msg)
				return err
			}
			buf := s.pieceBufs.Get().(*[]byte)
			defer s.pieceBufs.Put(buf)
			// Worth it when it saves an eighth: a piece of random bytes is not worth a decode.
			if enc := s2.Encode(*buf, msg.Data); len(enc) <= len(msg.Data)-len(msg.Data)/8 {
				msg.Data, msg.Header = enc, nats.Header{hdrCodec: []string{codecS2}}
			}
			_, err := jspub.Publish(ctx, s.js.Conn(), msg) // acked: the server is done with buf
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("kv: store request of %s: %w", key, err)
	}
	return nil
}

// Request reads rec's stored request (rec.RequestAt > 0), piece by piece: each a direct get,
// which a replica that has not caught up yet can miss, so a miss is read again from the
// stream's leader; ErrRequestLost when that has none either, or when a piece is not the size
// the record says (a request is never run with other bytes than its client sent).
func (s *Store) Request(ctx context.Context, key string, rec *Record) ([]byte, error) {
	var body []byte
	if rec.RequestPiece > 0 {
		body = make([]byte, rec.RequestBytes)
	}
	err := eachPiece(ctx, rec, func(ctx context.Context, i, lo, hi int) error {
		data, codec, err := s.requestPiece(ctx, s.pieceSubject(key, rec, i))
		switch {
		case errors.Is(err, errGone) && rec.RequestPiece == 0:
			return ErrRequestLost
		case errors.Is(err, errGone):
			return fmt.Errorf("piece %d: %w", i, ErrRequestLost)
		case err != nil:
			return err
		case rec.RequestPiece == 0:
			body = data
		case codec == codecS2:
			// Decoded in place; a block that does not decode to exactly the piece's size is
			// not the piece.
			if n, err := s2.DecodedLen(data); err != nil || n != hi-lo {
				return fmt.Errorf("piece %d decodes to %d bytes (%v), want %d: %w", i, n, err, hi-lo, ErrRequestLost)
			}
			if out, err := s2.Decode(body[lo:hi], data); err != nil || len(out) != hi-lo {
				return fmt.Errorf("piece %d does not decode (%v): %w", i, err, ErrRequestLost)
			}
		case codec != "":
			return fmt.Errorf("piece %d is stored as %q, which this node does not read: %w", i, codec, ErrRequestLost)
		case len(data) != hi-lo:
			return fmt.Errorf("piece %d is %d bytes, want %d: %w", i, len(data), hi-lo, ErrRequestLost)
		default:
			copy(body[lo:hi], data)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kv: request of %s epoch %d: %w", key, rec.RequestAt, err)
	}
	return body, nil
}

// requestPiece reads the message on subj and its hdrCodec: a direct get, then the leader on a
// miss.
func (s *Store) requestPiece(ctx context.Context, subj string) (data []byte, codec string, err error) {
	err = jsretry.Within(ctx, func(ctx context.Context) error {
		m, err := s.reqs.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			data, codec, err = s.leaderPiece(ctx, subj)
			return err
		}
		if err != nil {
			return err
		}
		data, codec = m.Data, m.Header.Get(hdrCodec)
		return nil
	})
	return data, codec, err
}

// leaderPiece reads the message on subj and its hdrCodec from the stream's leader.
func (s *Store) leaderPiece(ctx context.Context, subj string) (data []byte, codec string, err error) {
	m, err := leaderLastMsg(ctx, s.js, s.names.requests, subj)
	if err != nil {
		return nil, "", err
	}
	if len(m.Headers) > 0 {
		h, err := nats.DecodeHeadersMsg(m.Headers)
		if err != nil {
			return nil, "", fmt.Errorf("kv: leader read of %s: headers: %w", subj, err)
		}
		codec = h.Get(hdrCodec)
	}
	return m.Data, codec, nil
}

// DropRequest deletes the stored request of a finished record (nothing when it has none, or
// it is gone already). Best effort: what it leaves, the stream's age removes.
func (s *Store) DropRequest(ctx context.Context, key string, rec *Record) error {
	if rec.RequestAt == 0 || rec.State == Pending {
		return nil
	}
	subj := s.requestSubject(key, rec.RequestAt)
	if rec.RequestPiece > 0 {
		subj += ".>"
	}
	if err := s.reqs.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		return fmt.Errorf("kv: drop request of %s: %w", key, err)
	}
	return nil
}

// pieceSubject is the subject of piece i of rec's stored request.
func (s *Store) pieceSubject(key string, rec *Record, i int) string {
	subj := s.requestSubject(key, rec.RequestAt)
	if rec.RequestPiece == 0 {
		return subj
	}
	return subj + "." + strconv.Itoa(i)
}

// eachPiece calls f for every piece of rec's stored request with its index and byte range,
// piecesInFlight at once, and returns the first error (the calls still running see ctx end).
func eachPiece(ctx context.Context, rec *Record, f func(ctx context.Context, i, lo, hi int) error) error {
	if rec.RequestPiece == 0 {
		return f(ctx, 0, 0, len(rec.Request))
	}
	n := max(1, (rec.RequestBytes+rec.RequestPiece-1)/rec.RequestPiece)
	if n == 1 {
		return f(ctx, 0, 0, rec.RequestBytes)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(piecesInFlight)
	for i := range n {
		lo := i * rec.RequestPiece
		hi := min(rec.RequestBytes, lo+rec.RequestPiece)
		g.Go(func() error { return f(ctx, i, lo, hi) })
	}
	return g.Wait()
}
