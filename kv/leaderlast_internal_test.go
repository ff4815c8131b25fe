package kv

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// TestLeaderLast: the leader's read of a key is the record a direct get returns, at the
// same revision, read through a follower's connection on a 3-node cluster; a key never
// written or deleted is gone.
func TestLeaderLast(t *testing.T) {
	c := testkit.RunCluster(t, 3)
	_, admin := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Open(ctx, admin, BucketConfig{TTL: time.Hour, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	leader := c.StreamLeader(BucketStream)
	follower := (leader + 1) % c.Size()
	_, js := c.ConnectTo(t, follower)
	st, err := Open(ctx, js, BucketConfig{TTL: time.Hour, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	rec := &Record{State: Pending, Tenant: "t", JobID: "J", Epoch: 1, Fingerprint: "fp", Owner: "o"}
	rev, err := st.Claim(ctx, "k1", rec)
	if err != nil {
		t.Fatal(err)
	}
	next := *rec
	next.Owner = "o2"
	if rev, err = st.Update(ctx, "k1", &next, rev); err != nil {
		t.Fatal(err)
	}
	want, err := Encode(&next)
	if err != nil {
		t.Fatal(err)
	}
	data, srev, err := st.leaderLast(ctx, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if srev != rev || !bytes.Equal(data, want) {
		t.Fatalf("leader read: revision %d, %q; want revision %d, %q", srev, data, rev, want)
	}
	if _, _, err := st.leaderLast(ctx, "never"); !errors.Is(err, errGone) {
		t.Fatalf("a key never written: %v, want errGone", err)
	}
	if err := st.kv.Delete(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.leaderLast(ctx, "k1"); !errors.Is(err, errGone) {
		t.Fatalf("a deleted key: %v, want errGone", err)
	}
}

// TestLeaderPiece: the leader's read of a stored request's piece gives the bytes and the codec
// a direct get gives, for a compressed piece and for one stored as sent.
func TestLeaderPiece(t *testing.T) {
	s := testkit.RunJetStream(t, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := Open(ctx, s.JS, BucketConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		body  []byte
		codec string
	}{
		{"compressed", bytes.Repeat([]byte("words words "), 12<<10), codecS2},
		{"as sent", randomBytes(t, 100<<10), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &Record{State: Pending, Tenant: "t", JobID: "J", Epoch: 1, Fingerprint: "fp", Owner: "o", Request: tc.body}
			rec.StoreRequestOut()
			key := "piece-" + tc.name[:2]
			if err := st.PutRequest(ctx, key, rec); err != nil {
				t.Fatal(err)
			}
			subj := st.pieceSubject(key, rec, 1)
			direct, err := st.reqs.GetLastMsgForSubject(ctx, subj)
			if err != nil {
				t.Fatal(err)
			}
			data, codec, err := st.leaderPiece(ctx, subj)
			if err != nil || codec != tc.codec || direct.Header.Get(hdrCodec) != tc.codec || !bytes.Equal(data, direct.Data) {
				t.Fatalf("leader: %d bytes, codec %q, %v; direct: %d bytes, codec %q; want codec %q",
					len(data), codec, err, len(direct.Data), direct.Header.Get(hdrCodec), tc.codec)
			}
			if _, _, err := st.leaderPiece(ctx, st.pieceSubject(key, rec, 99)); !errors.Is(err, errGone) {
				t.Fatalf("a piece never written: %v, want errGone", err)
			}
		})
	}
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
