package kv_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/kv"
)

// TestRequestPlacement: a request up to the inline bound rides in its record's stored bytes;
// a larger one is left out of them (the record names it and keeps its size).
func TestRequestPlacement(t *testing.T) {
	const inline = 64
	s := testkit.RunJetStream(t, time.Second)
	store, err := kv.Open(context.Background(), s.JS, kv.BucketConfig{TTL: time.Hour, InlineRequestMax: inline})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		size   int
		stored bool
	}{
		{"empty", 0, false},
		{"at the bound", inline, false},
		{"one byte over", inline + 1, true},
		{"a megabyte", 1 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := bytes.Repeat([]byte("x"), tc.size)
			rec := pending("o")
			rec.Request = body
			if got := store.StoresRequest(len(body)); got != tc.stored {
				t.Fatalf("StoresRequest(%d) = %v, want %v", len(body), got, tc.stored)
			}
			if tc.stored {
				rec.StoreRequestOut()
			}
			data, err := kv.Encode(rec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := kv.Decode(data)
			if err != nil {
				t.Fatal(err)
			}
			wantInRecord := body
			if tc.stored {
				wantInRecord = nil
				if got.RequestAt != 1 || got.RequestBytes != tc.size {
					t.Fatalf("stored record names epoch %d, %d bytes; want 1, %d", got.RequestAt, got.RequestBytes, tc.size)
				}
				if len(data) > 1024 {
					t.Fatalf("record with a stored request is %d bytes", len(data))
				}
			}
			if !bytes.Equal(got.Request, wantInRecord) {
				t.Fatalf("record carries %d request bytes, want %d", len(got.Request), len(wantInRecord))
			}
			// A finished record keeps the size for a charge's estimate, whichever way it came.
			done := got.Completed(time.Now(), &kv.Result{Status: 200}, kv.Execution{})
			if done.RequestBytes != tc.size || done.Request != nil {
				t.Fatalf("finished record: %d request bytes kept, %d carried; want %d, 0", done.RequestBytes, len(done.Request), tc.size)
			}
		})
	}
}

// TestStoredRequestLifecycle: a stored request is read back by its key and claiming epoch,
// a later claim's request never replaces an earlier one's, and dropping a finished epoch's
// request leaves the later one: then its read is ErrRequestLost.
func TestStoredRequestLifecycle(t *testing.T) {
	store, s := open(t)
	ctx := context.Background()
	first, second := pending("o"), pending("o")
	first.Request, second.Request = []byte(`{"n":1}`), []byte(`{"n":2}`)
	second.Epoch = 3
	first.StoreRequestOut()
	second.StoreRequestOut()
	if _, err := store.Request(ctx, "k", first); !errors.Is(err, kv.ErrRequestLost) {
		t.Fatalf("read before the put: %v, want ErrRequestLost", err)
	}
	for _, rec := range []*kv.Record{first, second} {
		if err := store.PutRequest(ctx, "k", rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, rec := range []*kv.Record{first, second} {
		got, err := store.Request(ctx, "k", rec)
		if err != nil || !bytes.Equal(got, rec.Request) {
			t.Fatalf("epoch %d: %q %v, want %q", rec.RequestAt, got, err, rec.Request)
		}
	}
	// A PENDING record's request is not dropped (a re-drive needs it); a finished one's is.
	if err := store.DropRequest(ctx, "k", first); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Request(ctx, "k", first); err != nil {
		t.Fatalf("a PENDING record's request was dropped: %v", err)
	}
	done := first.Failed(time.Now(), &kv.Result{Status: 500}, kv.Execution{})
	if err := store.DropRequest(ctx, "k", done); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Request(ctx, "k", first); !errors.Is(err, kv.ErrRequestLost) {
		t.Fatalf("read after the drop: %v, want ErrRequestLost", err)
	}
	if got, err := store.Request(ctx, "k", second); err != nil || !bytes.Equal(got, second.Request) {
		t.Fatalf("the later claim's request after the earlier one's drop: %q %v", got, err)
	}
	st, err := s.JS.Stream(ctx, kv.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Storage != jetstream.FileStorage || info.State.Msgs != 1 {
		t.Fatalf("REQUESTS: %v storage, %d messages; want file, 1", info.Config.Storage, info.State.Msgs)
	}
}

// TestRequestPieces: a stored request is written in pieces and read back whole, whatever its
// size against the piece's; a missing piece or one of another size is ErrRequestLost (the
// request is never run with other bytes); the drop removes every piece; and a request stored
// before pieces (one message, RequestPiece 0) is still read and dropped.
func TestRequestPieces(t *testing.T) {
	store, s := open(t)
	ctx := context.Background()
	st, err := s.JS.Stream(ctx, kv.RequestsStream)
	if err != nil {
		t.Fatal(err)
	}
	msgs := func(filter string) uint64 {
		t.Helper()
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, c := range info.State.Subjects {
			n += c
		}
		return n
	}
	body := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('a' + i%23) // no piece equals another
		}
		return b
	}
	random := func(n int) []byte {
		b := make([]byte, n)
		_, _ = rand.Read(b) // never fails (crypto/rand)
		return b
	}
	// stored reads the pieces of key as REQUESTS holds them: how many carry the codec header,
	// and their bytes in all.
	stored := func(key string, pieces int) (compressed, bytes int) {
		t.Helper()
		for i := range pieces {
			m, err := st.GetLastMsgForSubject(ctx, "requests."+key+".1."+strconv.Itoa(i))
			if err != nil {
				t.Fatalf("piece %d: %v", i, err)
			}
			if c := m.Header.Get("Oncegate-Codec"); c == "s2" {
				compressed++
			} else if c != "" {
				t.Fatalf("piece %d: codec %q", i, c)
			}
			bytes += len(m.Data)
		}
		return compressed, bytes
	}
	const piece = 32 << 10
	for _, tc := range []struct {
		name       string
		size       int
		random     bool
		pieces     int
		compressed int // pieces stored compressed
	}{
		{"one byte", 1, false, 1, 0},
		{"one piece", piece, false, 1, 1},
		{"a byte over a piece", piece + 1, false, 2, 1}, // one byte does not compress
		{"a megabyte and 7 bytes", 1<<20 + 7, false, 33, 32},
		{"a random megabyte and 7 bytes", 1<<20 + 7, true, 33, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "p" + strconv.Itoa(tc.size) + strconv.FormatBool(tc.random)
			rec := pending("o")
			rec.Request = body(tc.size)
			if tc.random {
				rec.Request = random(tc.size)
			}
			rec.StoreRequestOut()
			if rec.RequestPiece != piece {
				t.Fatalf("RequestPiece %d, want %d", rec.RequestPiece, piece)
			}
			if err := store.PutRequest(ctx, key, rec); err != nil {
				t.Fatal(err)
			}
			if n := msgs("requests." + key + ".>"); n != uint64(tc.pieces) {
				t.Fatalf("%d messages, want %d pieces", n, tc.pieces)
			}
			compressed, n := stored(key, tc.pieces)
			if compressed != tc.compressed {
				t.Fatalf("%d pieces stored compressed, want %d", compressed, tc.compressed)
			}
			if tc.compressed == tc.pieces && n > tc.size/4 || tc.compressed == 0 && n != tc.size {
				t.Fatalf("%d bytes stored for %d (%d of %d pieces compressed)", n, tc.size, compressed, tc.pieces)
			}
			got, err := store.Request(ctx, key, rec)
			if err != nil || !bytes.Equal(got, rec.Request) {
				t.Fatalf("read back %d bytes (equal %v), %v; want %d", len(got), bytes.Equal(got, rec.Request), err, tc.size)
			}
			done := rec.Failed(time.Now(), &kv.Result{Status: 500}, kv.Execution{})
			if err := store.DropRequest(ctx, key, done); err != nil {
				t.Fatal(err)
			}
			if n := msgs("requests." + key + ".>"); n != 0 {
				t.Fatalf("%d pieces left after the drop", n)
			}
		})
	}

	publish := func(t *testing.T, subj, codec string, data []byte) {
		t.Helper()
		if _, err := s.JS.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: data, Header: nats.Header{"Oncegate-Codec": []string{codec}}}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("a piece missing or of another size", func(t *testing.T) {
		for i, damage := range []func(key string){
			func(key string) { // the middle piece purged
				if err := st.Purge(ctx, jetstream.WithPurgeSubject("requests."+key+".1.1")); err != nil {
					t.Fatal(err)
				}
			},
			func(key string) { // the last piece written again, shorter
				if _, err := s.JS.Publish(ctx, "requests."+key+".1.2", []byte("short")); err != nil {
					t.Fatal(err)
				}
			},
			func(key string) { // the first piece written again, compressed, a byte short
				publish(t, "requests."+key+".1.0", "s2", s2.Encode(nil, body(piece-1)))
			},
			func(key string) { // the first piece said to be compressed, and not
				publish(t, "requests."+key+".1.0", "s2", body(piece))
			},
			func(key string) { // the first piece compressed in a way this node does not know
				publish(t, "requests."+key+".1.0", "zstd", s2.Encode(nil, body(piece)))
			},
		} {
			key := "damaged" + strconv.Itoa(i)
			rec := pending("o")
			rec.Request = body(2*piece + 100)
			rec.StoreRequestOut()
			if err := store.PutRequest(ctx, key, rec); err != nil {
				t.Fatal(err)
			}
			damage(key)
			if got, err := store.Request(ctx, key, rec); !errors.Is(err, kv.ErrRequestLost) {
				t.Fatalf("damage %d: %d bytes, %v; want ErrRequestLost", i, len(got), err)
			}
		}
	})

	t.Run("stored before pieces", func(t *testing.T) {
		rec := pending("o")
		rec.Request = body(100 << 10)
		rec.StoreRequestOut()
		rec.RequestPiece = 0 // as a gateway before pieces stored it: one message
		if _, err := s.JS.Publish(ctx, "requests.old.1", rec.Request); err != nil {
			t.Fatal(err)
		}
		data, err := kv.Encode(rec)
		if err != nil {
			t.Fatal(err)
		}
		dec, err := kv.Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		got, err := store.Request(ctx, "old", dec)
		if err != nil || !bytes.Equal(got, rec.Request) {
			t.Fatalf("read back %d bytes, %v; want the one message's %d", len(got), err, len(rec.Request))
		}
		if err := store.DropRequest(ctx, "old", dec.Failed(time.Now(), &kv.Result{Status: 500}, kv.Execution{})); err != nil {
			t.Fatal(err)
		}
		if n := msgs("requests.old.>"); n != 0 {
			t.Fatalf("%d messages left after the drop", n)
		}
	})
}
