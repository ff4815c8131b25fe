package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// plainUpstream is an OpenAI-compatible backend on 127.0.0.1 that counts the requests of
// every path. Its answers carry their hit number, so two executions never answer alike: a
// body seen twice was replayed. /v1/audio/speech answers audio bytes (audio/mpeg); a body
// containing "reject" gets a 400.
type plainUpstream struct {
	*httptest.Server
	name string
	mu   sync.Mutex
	hits map[string]int
}

func startPlainUpstream(t testing.TB, name string) *plainUpstream {
	t.Helper()
	u := &plainUpstream{name: name, hits: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.hits[r.URL.Path]++
		n := u.hits[r.URL.Path]
		u.mu.Unlock()
		switch {
		case r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json":
			w.WriteHeader(http.StatusTeapot)
		case bytes.Contains(body, []byte("reject")):
			refuse(w, http.StatusBadRequest, "")
		case r.URL.Path == "/v1/audio/speech":
			w.Header().Set("Content-Type", "audio/mpeg")
			_, _ = w.Write([]byte{0xff, 0xfb, 0x90, byte(n), 0x00, 0x01})
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"%s-%d","object":"passthrough","path":%q,"body":%s}`, u.name, n, r.URL.Path, body)
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *plainUpstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[path]
}

func (u *plainUpstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.hits {
		n += c
	}
	return n
}

// TestPassthrough: listed paths are forwarded to their backend under their dedup policy
// (keyed-only by default, image generation off by default, on like chat), their answers'
// status, body and Content-Type stored and replayed; the body's model picks the backend;
// unlisted paths are 404 and bad input a 4xx, with no upstream call.
func TestPassthrough(t *testing.T) {
	up, up2 := startPlainUpstream(t, "up"), startPlainUpstream(t, "up2")
	cfg := gatewaykit.Config(t)
	b := fastRetryBackend("up", config.TypeOpenAI, up.URL+"/v1", "up-model")
	b.Passthrough = []config.Passthrough{{Path: "/v1/moderations"}, {Path: config.ImagesGenerationsPath},
		{Path: "/v1/audio/speech", Dedup: config.DedupOn}}
	b2 := fastRetryBackend("up2", config.TypeOpenAI, up2.URL+"/v1", "up2-model")
	b2.Passthrough = []config.Passthrough{{Path: "/v1/moderations", Dedup: config.DedupOff}}
	cfg.Backends = append(cfg.Backends, b, b2)
	gw := gatewaykit.StartGateway(t, cfg)
	post := func(path, body string, hdr map[string]string) result {
		t.Helper()
		return do(t, http.MethodPost, gw.URL+path, body, hdr)
	}
	expectFrom := func(r result, status int, outcome, backend string) {
		t.Helper()
		expect(t, r, status, outcome)
		if got := r.Header.Get("Oncegate-Backend"); got != backend {
			t.Errorf("Oncegate-Backend = %q, want %q", got, backend)
		}
	}

	t.Run("keyed-only: keyless requests execute every time", func(t *testing.T) {
		before := up.count("/v1/moderations")
		body := `{"input":"is this fine?"}`
		a, b := post("/v1/moderations", body, nil), post("/v1/moderations", body, nil)
		expectFrom(a, http.StatusOK, "bypassed", "up")
		expectFrom(b, http.StatusOK, "bypassed", "up")
		if n := up.count("/v1/moderations") - before; n != 2 || bytes.Equal(a.Body, b.Body) {
			t.Errorf("upstream hits = %d, want 2 (bodies %s / %s)", n, a.Body, b.Body)
		}
	})

	t.Run("keyed-only: a key deduplicates", func(t *testing.T) {
		before := up.count("/v1/moderations")
		key := map[string]string{"Idempotency-Key": "pt-mod-1"}
		body := `{"input":"check me once"}`
		a, b := post("/v1/moderations", body, key), post("/v1/moderations", body, key)
		expectFrom(a, http.StatusOK, "created", "up")
		expectFrom(b, http.StatusOK, "replayed", "up")
		if !bytes.Equal(a.Body, b.Body) || !strings.Contains(string(a.Body), `"path":"/v1/moderations"`) {
			t.Errorf("replay differs or wrong path:\n%s\n%s", a.Body, b.Body)
		}
		if ct := b.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type = %q", ct)
		}
		r := post("/v1/moderations", `{"input":"something else"}`, key)
		expectError(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
		if n := up.count("/v1/moderations") - before; n != 1 {
			t.Errorf("upstream hits = %d, want 1", n)
		}
	})

	t.Run("keyed-only: the backend's refusal is stored and replayed", func(t *testing.T) {
		before := up.count("/v1/moderations")
		key := map[string]string{"Idempotency-Key": "pt-mod-reject"}
		a, b := post("/v1/moderations", `{"input":"reject"}`, key), post("/v1/moderations", `{"input":"reject"}`, key)
		expect(t, a, http.StatusBadRequest, "created")
		expect(t, b, http.StatusBadRequest, "replayed")
		if !bytes.Equal(a.Body, b.Body) || b.Header.Get("x-should-retry") != "false" {
			t.Errorf("refusal replay: %s / %s (x-should-retry %q)", a.Body, b.Body, b.Header.Get("x-should-retry"))
		}
		if n := up.count("/v1/moderations") - before; n != 1 {
			t.Errorf("upstream hits = %d, want 1", n)
		}
	})

	t.Run("images are never deduplicated", func(t *testing.T) {
		before := up.count("/v1/images/generations")
		body := `{"model":"up-model","prompt":"a red fox"}`
		for _, hdr := range []map[string]string{nil, nil, {"Idempotency-Key": "pt-img"}, {"Idempotency-Key": "pt-img"}} {
			expectFrom(post("/v1/images/generations", body, hdr), http.StatusOK, "bypassed", "up")
		}
		if n := up.count("/v1/images/generations") - before; n != 4 {
			t.Errorf("upstream hits = %d, want 4", n)
		}
	})

	t.Run("on: identical keyless requests are one execution, Content-Type kept", func(t *testing.T) {
		before := up.count("/v1/audio/speech")
		body := `{"model":"up-model","input":"say it once","voice":"alloy"}`
		a, b := post("/v1/audio/speech", body, nil), post("/v1/audio/speech", body, nil)
		expectFrom(a, http.StatusOK, "created", "up")
		expectFrom(b, http.StatusOK, "replayed", "up")
		want := []byte{0xff, 0xfb, 0x90, byte(before + 1), 0x00, 0x01}
		if !bytes.Equal(a.Body, want) || !bytes.Equal(b.Body, want) {
			t.Errorf("bodies %x / %x, want %x", a.Body, b.Body, want)
		}
		for i, r := range []result{a, b} {
			if ct := r.Header.Get("Content-Type"); ct != "audio/mpeg" {
				t.Errorf("answer %d: Content-Type = %q, want audio/mpeg", i, ct)
			}
		}
		if n := up.count("/v1/audio/speech") - before; n != 1 {
			t.Errorf("upstream hits = %d, want 1", n)
		}
		expectFrom(post("/v1/audio/speech", body, map[string]string{"X-Allow-Duplicate": "true"}), http.StatusOK, "bypassed", "up")
		// A passthrough body is opaque: "stream" is part of its intent, not a transport field.
		expectFrom(post("/v1/audio/speech", `{"model":"up-model","input":"say it once","voice":"alloy","stream":false}`, nil),
			http.StatusOK, "created", "up")
		if n := up.count("/v1/audio/speech") - before; n != 3 {
			t.Errorf("upstream hits after X-Allow-Duplicate and a stream field = %d, want 3", n)
		}
	})

	t.Run("the body's model picks the backend", func(t *testing.T) {
		before, before2 := up.count("/v1/moderations"), up2.count("/v1/moderations")
		key := map[string]string{"Idempotency-Key": "pt-up2"}
		// up2's policy is off: its own requests execute every time, keyed or not.
		expectFrom(post("/v1/moderations", `{"model":"up2-model","input":"x"}`, key), http.StatusOK, "bypassed", "up2")
		expectFrom(post("/v1/moderations", `{"model":"up2-model","input":"x"}`, key), http.StatusOK, "bypassed", "up2")
		// A model that is not routed, or none: the first backend that lists the path.
		expectFrom(post("/v1/moderations", `{"model":"omni-moderation-latest","input":"x"}`, nil), http.StatusOK, "bypassed", "up")
		if n, n2 := up.count("/v1/moderations")-before, up2.count("/v1/moderations")-before2; n != 1 || n2 != 2 {
			t.Errorf("upstream hits up/up2 = %d/%d, want 1/2", n, n2)
		}
	})

	t.Run("unlisted paths and bad input reach no backend", func(t *testing.T) {
		before, before2 := up.total(), up2.total()
		for _, path := range []string{"/v1/audio/transcriptions", "/v1/images/edits", "/v1/moderations/extra", "/v2/moderations"} {
			r := post(path, `{"input":"x"}`, nil)
			expectStatus(t, r, http.StatusNotFound)
			assertOpenAIError(t, r, "unknown_url")
		}
		expectStatus(t, do(t, http.MethodGet, gw.URL+"/v1/moderations", "", nil), http.StatusMethodNotAllowed)
		expectError(t, post("/v1/moderations", `input=x`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}),
			http.StatusUnsupportedMediaType, "unsupported_media_type")
		expectError(t, post("/v1/moderations", `{"input":`, nil), http.StatusBadRequest, "invalid_json")
		expectError(t, post("/v1/moderations", `["input"]`, nil), http.StatusBadRequest, "invalid_json")
		expectError(t, post("/v1/moderations", `{"input":"x"}`, map[string]string{"Idempotency-Key": ""}), http.StatusBadRequest, "invalid_idempotency_key")
		if n, n2 := up.total()-before, up2.total()-before2; n != 0 || n2 != 0 {
			t.Errorf("upstream hits = %d/%d, want none", n, n2)
		}
	})
}
