package httpapi_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestIdempotencyExpiresOneInstant: one key, one expiry. A slow streamed first answer (its
// headers go out with its first chunk), a copy that joins it more than a second later, and a
// replay after it finished all carry the same Idempotency-Expires: the claim's time (the
// record's "created") plus idempotency.ttl, read from the record, not the clock of the
// moment each answer starts.
func TestIdempotencyExpiresOneInstant(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	const key = "expires-one-instant"
	// 12 tokens 250 ms apart: the stream runs about 3 s, long enough to join it a second
	// after its headers and still find it running.
	body := `{"model":"oncegate-mock","stream":true,"messages":[{"role":"user","content":"expires"}],` +
		`"mock":{"tokens":12,"inter_token_ms":250}}`
	open := func(t *testing.T) *http.Response {
		t.Helper()
		resp, err := openChat(gw, body, map[string]string{"Idempotency-Key": key})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp
	}
	drain := func(t *testing.T, resp *http.Response) {
		t.Helper()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
	}

	first := open(t)
	headersAt := time.Now()
	// Read the first stream until a second has passed since its headers arrived (each token
	// takes 250 ms): the joined copy's answer then starts in a later second than the first's.
	sc := bufio.NewScanner(first.Body)
	for time.Since(headersAt) <= time.Second {
		if !sc.Scan() {
			t.Fatalf("the first stream ended within a second of its headers (%v): make it longer", sc.Err())
		}
		if strings.Contains(sc.Text(), "[DONE]") {
			t.Fatal("the first stream finished within a second of its headers: make it longer")
		}
	}
	joined := open(t)
	for sc.Scan() { // the rest of the first stream
	}
	drain(t, joined)
	replayed := open(t)
	drain(t, replayed)

	for name, want := range map[string]struct {
		resp    *http.Response
		outcome string
	}{"first": {first, "created"}, "joined": {joined, "joined"}, "replayed": {replayed, "replayed"}} {
		if got := want.resp.Header.Get("Oncegate-Idempotency"); got != want.outcome {
			t.Fatalf("%s: Oncegate-Idempotency %q, want %q", name, got, want.outcome)
		}
	}

	// The instant every answer must say: the record's claim time plus the TTL.
	resp, err := gatewaykit.Client().Get(gw.URL + "/v1/idempotency/" + key)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var status struct {
		Created time.Time `json:"created"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil || status.Created.IsZero() {
		t.Fatalf("status of %s: %v, created %v", key, err, status.Created)
	}
	want := status.Created.Add(gw.Cfg.Idempotency.TTL.D()).UTC().Format(http.TimeFormat)
	for name, r := range map[string]*http.Response{"first": first, "joined": joined, "replayed": replayed} {
		if got := r.Header.Get("Idempotency-Expires"); got != want {
			t.Errorf("%s answer: Idempotency-Expires %q, want %q (created %s + ttl %s)", name, got, want,
				status.Created.Format(time.RFC3339Nano), gw.Cfg.Idempotency.TTL.D())
		}
	}
}
