package natsrv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/internal/testkit"
)

// bucket is the KV bucket the recovery tests fill; its stream is KV_<bucket>.
const (
	bucket       = "RECOVERY"
	bucketStream = "KV_" + bucket
)

// fillBucket starts a server on dir, writes n keys into a file-stored KV bucket (one message
// per key, as the gateway's records are) and shuts the server down cleanly.
func fillBucket(t *testing.T, dir string, n int) {
	t.Helper()
	srv, err := natsrv.Start(startCtx(t), natsrv.Options{StoreDir: dir, SyncInterval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, js := (&testkit.JetStream{Server: srv}).Conn(t)
	defer nc.Close()
	ctx := startCtx(t)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 1, TTL: time.Hour, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 200)
	const window = 2048 // acks outstanding at once
	for i := range n {
		if _, err := js.PublishAsync(keySubject(i), val); err != nil {
			t.Fatal(err)
		}
		if i%window == window-1 {
			<-js.PublishAsyncComplete()
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("the bucket's writes were not acknowledged")
	}
}

// startCtx bounds a start or a test's requests.
func startCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func keySubject(i int) string { return "$KV." + bucket + "." + keyName(i) }
func keyName(i int) string    { return fmt.Sprintf("k%07d", i) }

// forgetIndex makes the next start rebuild stream's state from its message blocks, as after a
// crash of a server whose stream holds more than a million subjects (nats-server then stops
// writing the stream's index file, msgs/index.db, except at a clean shutdown).
func forgetIndex(t *testing.T, dir, stream string) {
	t.Helper()
	if err := os.Remove(indexFile(dir, stream)); err != nil {
		t.Fatal(err)
	}
}

// indexFile is stream's index file in the store dir.
func indexFile(dir, stream string) string {
	return filepath.Join(dir, server.JetStreamStoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams", stream, "msgs", "index.db")
}

// TestStartWaitsForAStoreRebuild: a store whose rebuild takes longer than ReadyTimeout (the
// fixed wait a start had, issue 43: 10 s against 25.6 s for 6 M keys, so a crashed node never
// came back) is waited for while it makes progress, and served with its data. The limit is
// half the rebuild's own time here, measured on the same store first: the rule is tested, not
// the size.
func TestStartWaitsForAStoreRebuild(t *testing.T) {
	dir := t.TempDir()
	const keys = 200_000
	fillBucket(t, dir, keys)

	// The rebuild's time on this machine, with the default limit.
	forgetIndex(t, dir, bucketStream)
	began := time.Now()
	srv, err := natsrv.Start(startCtx(t), natsrv.Options{StoreDir: dir})
	if err != nil {
		t.Fatalf("start with the default limit: %v", err)
	}
	rebuild := time.Since(began)
	srv.Shutdown()

	forgetIndex(t, dir, bucketStream)
	limit := rebuild / 4
	began = time.Now()
	// A ctx without a deadline, as serve's: a deadline would replace the limit.
	var logged testkit.SyncBuffer
	srv, err = natsrv.Start(context.Background(), natsrv.Options{StoreDir: dir, ReadyTimeout: limit, Log: zerolog.New(&logged)})
	if err != nil {
		t.Fatalf("a rebuild of %v against a ReadyTimeout of %v: %v", rebuild, limit, err)
	}
	defer srv.Shutdown()
	if took := time.Since(began); took <= limit {
		t.Fatalf("the premise failed: the second rebuild took %v, no longer than the limit %v (the first took %v)", took, limit, rebuild)
	}
	if want := fmt.Sprintf(`"stream":%q,"messages":%d,`, bucketStream, keys); !strings.Contains(logged.String(), want) {
		t.Errorf("the log does not say the stream was restored (%s):\n%s", want, logged.String())
	}

	_, js := (&testkit.JetStream{Server: srv}).Conn(t)
	ctx := startCtx(t)
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Values() != keys {
		t.Errorf("%d values after the rebuild, want %d", st.Values(), keys)
	}
	for _, i := range []int{0, keys - 1} {
		if _, err := kv.Get(ctx, keyName(i)); err != nil {
			t.Errorf("key %s after the rebuild: %v", keyName(i), err)
		}
	}
}

// TestStartGivesUpOnAStalledRestore: a restore that makes no progress (its store does not
// answer a read) fails the start after StallTimeout with ErrNotReady, in one line that says
// which stream it was restoring; meanwhile OnRecovery reports that stream.
func TestStartGivesUpOnAStalledRestore(t *testing.T) {
	// The server given up on finishes its restore in the background once the file is released
	// (its start goroutine was blocked in it), writing into the store while a t.TempDir cleanup
	// would remove it: the directory is removed once nothing writes there any more.
	dir, err := os.MkdirTemp("", "stalled-restore-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error { return os.RemoveAll(dir) })
	})
	fillBucket(t, dir, 1000)
	release := testkit.HoldFile(t, indexFile(dir, bucketStream))
	var mu sync.Mutex
	var seen []natsrv.Recovery
	_, err = natsrv.Start(context.Background(), natsrv.Options{StoreDir: dir, StallTimeout: 300 * time.Millisecond,
		OnRecovery: func(r natsrv.Recovery) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, r)
		}})
	release()
	if !errors.Is(err, natsrv.ErrNotReady) || !strings.Contains(err.Error(), "no progress for 300ms while restoring stream "+bucketStream) {
		t.Fatalf("err %v, want ErrNotReady: no progress while restoring %s", err, bucketStream)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || !slices.Equal(seen[0].Streams, []string{bucketStream}) || seen[0].StoreBytes <= 0 {
		t.Errorf("OnRecovery saw %+v, want the restore of %s with the store's size", seen, bucketStream)
	}
}
