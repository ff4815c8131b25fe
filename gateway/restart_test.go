package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/oncegate/oncegate/internal/natsrv"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
	"github.com/oncegate/oncegate/jobs"
)

// externalNATS is a standalone nats-server on a network port that a test can restart: same
// port, same store directory (file streams survive a restart; memory streams do not).
type externalNATS struct {
	t    *testing.T
	dir  string
	addr string
	ns   *natsrv.Server // nil while stopped
}

func runExternalNATS(t *testing.T) *externalNATS {
	e := &externalNATS{t: t, dir: t.TempDir(), addr: testkit.FreeAddr(t)}
	e.start()
	t.Cleanup(e.stop)
	return e
}

func (e *externalNATS) start() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := natsrv.Start(ctx, natsrv.Options{StoreDir: e.dir, Listen: e.addr, ServerName: "external"})
	if err != nil {
		e.t.Fatalf("nats-server: %v", err)
	}
	e.ns = ns
}

func (e *externalNATS) stop() {
	if e.ns != nil {
		e.ns.Shutdown()
		e.ns = nil
	}
}

func (e *externalNATS) url() string { return "nats://" + e.addr }

// jetStream connects to the server as name (closed when the test ends).
func (e *externalNATS) jetStream(name string) jetstream.JetStream {
	nc, err := natsrv.ConnectURL(e.url(), name)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	return js
}

// readyz is /readyz's status and body.
func readyz(base string) (int, string, error) {
	resp, err := gatewaykit.Client().Get(base + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// readyzIs is a CheckFor condition: /readyz answers status, with want in its body.
func readyzIs(base string, status int, want string) func() error {
	return func() error {
		got, body, err := readyz(base)
		if err != nil {
			return err
		}
		if got != status || !strings.Contains(body, want) {
			return fmt.Errorf("/readyz %d %s, want %d with %q", got, body, status, want)
		}
		return nil
	}
}

// memoryStreams are the streams a NATS restart loses.
var memoryStreams = []string{jobs.JobsStream, jobs.ChunksStream, "PROGRESS", "KV_STATUS"}

// streamsExist is a CheckFor condition: every one of names exists.
func streamsExist(js jetstream.JetStream, names []string) func() error {
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, n := range names {
			if _, err := js.Stream(ctx, n); err != nil {
				return fmt.Errorf("stream %s: %w", n, err)
			}
		}
		return nil
	}
}

// TestRecoversFromNATSRestart: a gateway on a standalone nats-server that restarts (losing its
// memory streams) recreates them on reconnect, without being restarted and without /readyz
// being asked; /readyz is 503 while NATS is gone and 200 again after; requests are answered.
func TestRecoversFromNATSRestart(t *testing.T) {
	nats := runExternalNATS(t)
	cfg := gatewaykit.Config(t)
	cfg.NATS.URL = nats.url()
	cfg.Workers.Concurrency = 4
	gw := gatewaykit.StartGateway(t, cfg)
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, readyzIs(gw.URL, http.StatusOK, "ready"))
	chat(t, gw.URL, "before-restart-0001")

	nats.stop()
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, readyzIs(gw.URL, http.StatusServiceUnavailable, "NATS"))
	nats.start()

	js := nats.jetStream("restart-test")
	// Recreated by the reconnect alone: nothing has asked /readyz since NATS came back.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, streamsExist(js, memoryStreams))
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, readyzIs(gw.URL, http.StatusOK, "ready"))
	chat(t, gw.URL, "after-restart-0001")
	chat(t, gw.URL, "after-restart-0002")
}

// TestReadyzWhileStreamMissing: a memory stream deleted under a connected gateway (no
// reconnect to notice) makes /readyz 503 naming it; the check has the gateway recreate it, and
// /readyz is 200 again.
func TestReadyzWhileStreamMissing(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, readyzIs(gw.URL, http.StatusOK, "ready"))
	js := gw.JetStream(t, "readyz-test")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, jobs.ChunksStream); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, readyzIs(gw.URL, http.StatusServiceUnavailable, jobs.ChunksStream))
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, streamsExist(js, []string{jobs.ChunksStream}))
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, readyzIs(gw.URL, http.StatusOK, "ready"))
	chat(t, gw.URL, "after-delete-0001")
}
