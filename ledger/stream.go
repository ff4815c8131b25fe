package ledger

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/partition"
	"github.com/oncegate/oncegate/internal/replicas"
)

// StreamConfig is the configuration EnsureStream creates LEDGER with (replicas 1, which
// EnsureReplicated raises; an existing stream keeps its own count when larger).
func StreamConfig() jetstream.StreamConfig { return PartitionStreamConfig(0) }

// PartitionStreamConfig is StreamConfig for partition p: stream p.Stream(StreamName), subjects
// p.Subject("ledger.>"). Partition 0's is LEDGER's.
func PartitionStreamConfig(p partition.P) jetstream.StreamConfig {
	desc := "oncegate billing ledger: append-only, hash-chained per tenant"
	if p != 0 {
		desc = fmt.Sprintf("oncegate billing ledger, partition %d: append-only, hash-chained per tenant", p)
	}
	return jetstream.StreamConfig{
		Name:              p.Stream(StreamName),
		Description:       desc,
		Subjects:          []string{p.Subject(allSubjects)},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Discard:           jetstream.DiscardNew,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxAge:            0,
		MaxMsgsPerSubject: -1,
		Duplicates:        DuplicateWindow,
		DenyDelete:        true,
		DenyPurge:         true,
		AllowRollup:       false,
		// Appends are committed in atomic batches (append.go); a server before 2.12
		// ignores the setting and gets them one by one.
		AllowAtomicPublish: true,
		// A chain's catch-up reads the entries other nodes appended in one batched direct
		// get from the local replica (read.go's follow).
		AllowDirect: true,
		Replicas:    1,
	}
}

// EnsureStream is EnsureReplicated with one replica (an existing stream keeps its own count).
func EnsureStream(ctx context.Context, js jetstream.JetStream) error {
	return EnsureReplicated(ctx, js, 1)
}

// EnsureReplicated creates the LEDGER stream with n replicas, or brings an existing one up to
// the ledger's protections without ever lowering one: deletes, purges and rollups denied,
// discard new, no age limit and no per-subject limit (both evict entries), message TTLs off,
// synchronous persistence, a duplicate window of at least DuplicateWindow, at least n
// replicas (raised in place; never lowered). Limits that only refuse new entries (MaxMsgs,
// MaxBytes with discard new) and placement are kept. It updates the stream only when something
// must change, so it is idempotent and needs no update permission on a stream that is already
// right. A memory, mirrored or sealed LEDGER is an ErrStreamConfig; a replica count NATS
// refuses is a replicas.ErrReplicas that says what to do.
func EnsureReplicated(ctx context.Context, js jetstream.JetStream, n int) error {
	return EnsurePartition(ctx, js, 0, n, nil)
}

// EnsurePartition is EnsureReplicated for partition p's stream (PartitionStreamConfig), created
// with placement when it is not nil (an existing stream keeps its own placement).
func EnsurePartition(ctx context.Context, js jetstream.JetStream, p partition.P, n int, placement *jetstream.Placement) error {
	want := PartitionStreamConfig(p)
	want.Replicas = max(n, 1)
	want.Placement = placement
	all := want.Subjects[0]
	return ensureStream(ctx, js, want, func(cur jetstream.StreamConfig) (jetstream.StreamConfig, error) {
		return tighten(cur, all)
	})
}

// ensureStream creates the stream want names with want, or updates an existing one to what fix
// makes of its configuration with at least want's replicas (raised in place and waited for,
// never lowered); it updates only when something must change.
func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, fix func(jetstream.StreamConfig) (jetstream.StreamConfig, error)) error {
	name := want.Name
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, want)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("ledger: create stream %s: %w", name, replicas.Explain(name, 0, want.Replicas, err))
		}
		st, err = js.Stream(ctx, name) // created meanwhile by another process: check it
	}
	if err != nil {
		return fmt.Errorf("ledger: stream %s: %w", name, err)
	}
	cur := st.CachedInfo().Config
	next, err := fix(cur)
	if err != nil {
		return err
	}
	next.Replicas = max(cur.Replicas, want.Replicas)
	if reflect.DeepEqual(next, cur) {
		return nil
	}
	if _, err := js.UpdateStream(ctx, next); err != nil {
		return fmt.Errorf("ledger: update stream %s: %w", name, replicas.Explain(name, cur.Replicas, next.Replicas, err))
	}
	if err := replicas.WaitRaised(ctx, js, name, cur.Replicas, next.Replicas); err != nil {
		return fmt.Errorf("ledger: raise stream %s: %w", name, err)
	}
	return nil
}

// tighten returns cur with every ledger protection in place, and its subjects all.
func tighten(cur jetstream.StreamConfig, all string) (jetstream.StreamConfig, error) {
	switch {
	case cur.Storage != jetstream.FileStorage:
		return cur, fmt.Errorf("%w: %s uses %s storage; the ledger needs file storage (recreate it)", ErrStreamConfig, cur.Name, cur.Storage)
	case cur.Mirror != nil:
		return cur, fmt.Errorf("%w: %s is a mirror; the ledger must be the origin", ErrStreamConfig, cur.Name)
	case cur.Sealed:
		return cur, fmt.Errorf("%w: %s is sealed", ErrStreamConfig, cur.Name)
	case cur.Retention != jetstream.LimitsPolicy:
		return cur, fmt.Errorf("%w: %s has retention %s; the ledger needs limits retention", ErrStreamConfig, cur.Name, cur.Retention)
	}
	next := cur
	next.Subjects = slices.Clone(cur.Subjects)
	if !slices.Contains(next.Subjects, all) {
		next.Subjects = append(next.Subjects, all)
	}
	next.DenyDelete, next.DenyPurge, next.AllowRollup = true, true, false
	next.Discard = jetstream.DiscardNew
	next.MaxAge = 0
	next.MaxMsgsPerSubject = -1
	next.DiscardNewPerSubject = false
	next.AllowMsgTTL, next.SubjectDeleteMarkerTTL = false, 0
	next.PersistMode = jetstream.DefaultPersistMode
	next.AllowAtomicPublish = true
	next.AllowDirect = true
	next.Duplicates = max(cur.Duplicates, DuplicateWindow)
	if next.MaxMsgs == 0 {
		next.MaxMsgs = -1
	}
	if next.MaxBytes == 0 {
		next.MaxBytes = -1
	}
	return next, nil
}
