package httpapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/intent"
	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/jobs"
)

// sseRig is a real JetStream with the chunk streams, a hub, and a Fiber app on 127.0.0.1
// whose routes follow one execution with an sseWriter; each live stream reports how its
// writer ended on ended.
type sseRig struct {
	hub   *jobs.Hub
	pub   *jobs.Publisher
	job   *jobs.Job
	url   string
	ended chan error
}

func newSSERig(t *testing.T) *sseRig {
	t.Helper()
	srv := testkit.RunJetStream(t, time.Second)
	ctx := context.Background()
	if err := jobs.EnsureStreams(ctx, srv.JS, jobs.StreamConfig{}); err != nil {
		t.Fatal(err)
	}
	r := &sseRig{hub: jobs.NewHub(srv.NC, srv.JS, zerolog.Nop(), jobs.HubOptions{CoreFastPath: true}),
		job: &jobs.Job{ID: jobs.NewID(), Key: "k1", Epoch: 1}, ended: make(chan error, 4)}
	t.Cleanup(r.hub.Close)
	r.pub = jobs.NewPublisher(srv.JS, r.job)

	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	follow := func(c *fiber.Ctx, out *sseWriter) error {
		fl, err := r.hub.Open(c.UserContext(), r.job.Subject())
		if err != nil {
			return err
		}
		out.live(c, intent.FeedOf(fl, 10*time.Millisecond), 5*time.Second, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for {
				ev, err := out.nextEvent(ctx)
				if err != nil {
					r.ended <- err
					return
				}
				if ev.Kind != intent.Data && ev.Kind != intent.Usage {
					r.ended <- out.end(ev.Payload())
					return
				}
				if err := out.write(ev.Payload()); err != nil {
					r.ended <- err
					return
				}
			}
		})
		return nil
	}
	app.Get("/chat", func(c *fiber.Ctx) error { return follow(c, &sseWriter{}) })
	app.Get("/events", func(c *fiber.Ctx) error { return follow(c, eventStream(c.QueryInt("after", -1))) })
	app.Get("/chat/whole", func(c *fiber.Ctx) error { return (&sseWriter{}).whole(c, []byte("data: a\n\ndata: b\n\n")) })
	app.Get("/events/whole", func(c *fiber.Ctx) error {
		return eventStream(c.QueryInt("after", -1)).whole(c, []byte("data: a\n\ndata: b\n\n"))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = app.Listener(ln) }()
	t.Cleanup(func() { _ = app.Shutdown() })
	r.url = "http://" + ln.Addr().String()
	return r
}

func (r *sseRig) publish(t *testing.T, kind jobs.Kind, payload string) {
	t.Helper()
	if err := r.pub.Publish(context.Background(), kind, http.StatusOK, []byte(payload)); err != nil {
		t.Fatal(err)
	}
}

func (r *sseRig) get(t *testing.T, path string) *http.Response {
	t.Helper()
	resp, err := http.Get(r.url + path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	for h, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(h); resp.StatusCode != http.StatusOK || got != want {
			t.Fatalf("GET %s: status %d, %s %q; want 200, %q", path, resp.StatusCode, h, got, want)
		}
	}
	return resp
}

// readUntil reads frames from br until one contains want, and returns what it read.
func readUntil(t *testing.T, br *bufio.Reader, want string) string {
	t.Helper()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		line, err := br.ReadString('\n')
		got.WriteString(line)
		if err != nil {
			t.Fatalf("read %q, then %v; waiting for %q", got.String(), err, want)
		}
	}
	return got.String()
}

// TestSSEWriter: the chat stream and the job events write the same chunks through one writer,
// the chat stream as they are, the job events numbered and resumed after the id asked for;
// both send heartbeats while the execution is idle, live or in one piece.
func TestSSEWriter(t *testing.T) {
	cases := []struct {
		path string
		want string // the stream without heartbeats
	}{
		{"/chat", "data: a\n\ndata: b\n\ndata: [DONE]\n\n"},
		{"/events", "id: 0\ndata: a\n\nid: 1\ndata: b\n\nid: 2\ndata: [DONE]\n\n"},
		{"/events?after=0", "id: 1\ndata: b\n\nid: 2\ndata: [DONE]\n\n"},
	}
	r := newSSERig(t)
	var bodies []*bufio.Reader
	for _, tc := range cases {
		bodies = append(bodies, bufio.NewReader(r.get(t, tc.path).Body))
	}
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := r.hub.Active(); n != 1 {
			return fmt.Errorf("hub follows %d executions, want the one all streams follow", n)
		}
		return nil
	})
	// Nothing published yet: each stream gets heartbeats, and nothing else.
	for i, br := range bodies {
		if got := readUntil(t, br, string(pingFrame)); got != string(pingFrame) {
			t.Fatalf("%s: before any chunk got %q, want a heartbeat", cases[i].path, got)
		}
	}
	r.publish(t, jobs.KindData, "data: a\n\n")
	r.publish(t, jobs.KindData, "data: b\n\n")
	r.publish(t, jobs.KindDone, "data: [DONE]\n\n")
	for i, br := range bodies {
		rest, err := io.ReadAll(br)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.ReplaceAll(string(rest), string(pingFrame), ""); got != cases[i].want {
			t.Errorf("%s: got %q, want %q", cases[i].path, got, cases[i].want)
		}
	}
	for range cases {
		if err := testkit.RequireChanRead(t, r.ended, 10*time.Second); err != nil {
			t.Errorf("a stream ended with %v, want nil after its terminal chunk", err)
		}
	}

	for path, want := range map[string]string{
		"/chat/whole":           "data: a\n\ndata: b\n\n",
		"/events/whole":         "id: 0\ndata: a\n\nid: 1\ndata: b\n\n",
		"/events/whole?after=0": "id: 1\ndata: b\n\n",
	} {
		got, err := io.ReadAll(r.get(t, path).Body)
		if err != nil || string(got) != want {
			t.Errorf("%s: got %q (%v), want %q", path, got, err, want)
		}
	}
}

// TestSSEWriterClientGone: a stream whose client left ends on its first failed write (a
// heartbeat while the execution is idle) and closes its follower, so the hub stops following
// an execution nobody reads here.
func TestSSEWriterClientGone(t *testing.T) {
	r := newSSERig(t)
	resp := r.get(t, "/chat")
	r.publish(t, jobs.KindData, "data: a\n\n")
	readUntil(t, bufio.NewReader(resp.Body), "data: a\n")
	resp.Body.Close()
	err := testkit.RequireChanRead(t, r.ended, 10*time.Second)
	if !errors.Is(err, errClientGone) {
		t.Fatalf("stream ended with %v, want errClientGone", err)
	}
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := r.hub.Active(); n != 0 {
			return errors.New("hub still follows " + strconv.Itoa(n) + " execution(s)")
		}
		return nil
	})
}
