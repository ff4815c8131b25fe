package httpapi_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// dedupAnswer is what the test reads of one answer.
type dedupAnswer struct {
	status  int
	outcome string // Oncegate-Idempotency
	job     string // Oncegate-Job-Id
	key     string // Idempotency-Key, as echoed
	reason  string // Oncegate-Dedup-Reason
	body    []byte
}

func postChat(t *testing.T, gw *gatewaykit.Gateway, body string, header map[string]string) dedupAnswer {
	t.Helper()
	a, err := doChat(gw, body, header)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// openChat posts a chat completion and returns the answer with its body unread (from any
// goroutine: it fails no test itself).
func openChat(gw *gatewaykit.Gateway, body string, header map[string]string) (*http.Response, error) {
	return openPost(gw, "/v1/chat/completions", body, header)
}

// openPost posts a JSON body to path, as openChat.
func openPost(gw *gatewaykit.Gateway, path, body string, header map[string]string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, gw.URL+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return gatewaykit.Client().Do(req)
}

// doChat posts a chat completion (from any goroutine: it fails no test itself).
func doChat(gw *gatewaykit.Gateway, body string, header map[string]string) (dedupAnswer, error) {
	resp, err := openChat(gw, body, header)
	if err != nil {
		return dedupAnswer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return dedupAnswer{}, err
	}
	return dedupAnswer{status: resp.StatusCode, outcome: resp.Header.Get("Oncegate-Idempotency"), job: resp.Header.Get("Oncegate-Job-Id"),
		key: resp.Header.Get("Idempotency-Key"), reason: resp.Header.Get("Oncegate-Dedup-Reason"), body: b}, nil
}

// parseReason reads the Oncegate-Dedup-Reason dictionary (rule=token, the others strings).
func parseReason(t *testing.T, v string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, member := range strings.Split(v, ", ") {
		k, val, ok := strings.Cut(member, "=")
		if !ok {
			t.Fatalf("member %q of %q has no value", member, v)
		}
		if strings.HasPrefix(val, `"`) {
			if err := json.Unmarshal([]byte(val), &val); err != nil {
				t.Fatalf("member %q of %q: %v", member, v, err)
			}
		}
		out[k] = val
	}
	return out
}

// TestDedupReason: a joined or replayed request that asked for it (Oncegate-Dedup-Reason:
// true) is told which earlier execution it got (its job id), when that execution's request
// arrived, and which rule matched: for each rule, through real HTTP against a real embedded
// gateway. Without the opt-in the header is absent and the replayed bytes are the same, and a
// request that executed gets no reason at all.
func TestDedupReason(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.Idempotency.RetryHeaders = []string{"X-Retry-Attempt"}
	gw := gatewaykit.StartGateway(t, cfg)
	body := func(name string) string {
		return fmt.Sprintf(`{"model":"oncegate-mock","messages":[{"role":"user","content":"dedup reason %s"}]}`, name)
	}
	cases := []struct {
		name          string
		first, second map[string]string // headers of the first request and of its copy
		firstOutcome  string
		rule, header  string
	}{
		{name: "client key", first: map[string]string{"Idempotency-Key": "why-1"}, second: map[string]string{"Idempotency-Key": "why-1"},
			firstOutcome: "created", rule: "idempotency_key"},
		{name: "auto key in its window", first: map[string]string{}, second: map[string]string{},
			firstOutcome: "created", rule: "auto_key_window"},
		{name: "SDK retry of an auto key", first: map[string]string{"x-stainless-retry-count": "0"}, second: map[string]string{"x-stainless-retry-count": "1"},
			firstOutcome: "created", rule: "sdk_retry_header", header: "x-stainless-retry-count"},
		{name: "SDK retry of a bypassed request", first: map[string]string{"X-Allow-Duplicate": "true", "x-stainless-retry-count": "0"},
			second:       map[string]string{"X-Allow-Duplicate": "true", "x-stainless-retry-count": "1"},
			firstOutcome: "bypassed", rule: "sdk_retry_header", header: "x-stainless-retry-count"},
		{name: "configured retry header", first: map[string]string{}, second: map[string]string{"X-Retry-Attempt": "1"},
			firstOutcome: "created", rule: "retry_header", header: "x-retry-attempt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := body(tc.name)
			withOptIn := func(h map[string]string) map[string]string {
				out := map[string]string{"Oncegate-Dedup-Reason": "true"}
				for k, v := range h {
					out[k] = v
				}
				return out
			}
			before := time.Now()
			first := postChat(t, gw, b, withOptIn(tc.first))
			after := time.Now()
			if first.status != http.StatusOK || first.outcome != tc.firstOutcome {
				t.Fatalf("first: %d %q, want 200 %q: %s", first.status, first.outcome, tc.firstOutcome, first.body)
			}
			if first.reason != "" {
				t.Errorf("first (it executed) has Oncegate-Dedup-Reason %q, want none", first.reason)
			}
			plain := postChat(t, gw, b, tc.second)
			if plain.outcome != "replayed" || plain.job != first.job {
				t.Fatalf("copy without opt-in: %q job %s, want replayed job %s", plain.outcome, plain.job, first.job)
			}
			if plain.reason != "" {
				t.Errorf("copy without opt-in has Oncegate-Dedup-Reason %q, want none", plain.reason)
			}
			asked := postChat(t, gw, b, withOptIn(tc.second))
			if asked.outcome != "replayed" || asked.job != first.job {
				t.Fatalf("copy with opt-in: %q job %s, want replayed job %s", asked.outcome, asked.job, first.job)
			}
			if !bytes.Equal(asked.body, plain.body) {
				t.Errorf("the opt-in changed the replayed body:\n%s\nvs\n%s", asked.body, plain.body)
			}
			got := parseReason(t, asked.reason)
			if got["rule"] != tc.rule || got["header"] != tc.header || got["job"] != first.job {
				t.Errorf("reason %q: rule %q header %q job %q, want %q %q %q", asked.reason, got["rule"], got["header"], got["job"], tc.rule, tc.header, first.job)
			}
			arrived, err := time.Parse(time.RFC3339Nano, got["arrived"])
			if err != nil {
				t.Fatalf("arrived %q: %v", got["arrived"], err)
			}
			if arrived.Before(before.Add(-time.Millisecond)) || arrived.After(after) {
				t.Errorf("arrived %s, want the first request's arrival, within [%s, %s]", arrived, before, after)
			}
		})
	}
}

// TestDedupStatus: the status API (GET /v1/idempotency/{key}, GET /v1/jobs/{id}) names the
// execution copies of a key attach to, when its first request arrived, and the rules a copy
// is matched by: a client's key by that key alone, an auto key by its window (until when)
// and by a declared retry, by idempotency.retry_headers only when some are configured.
func TestDedupStatus(t *testing.T) {
	plain := gatewaykit.StartGateway(t, nil)
	cfg := gatewaykit.Config(t)
	cfg.Idempotency.RetryHeaders = []string{"X-Retry-Attempt"}
	withRetryHeaders := gatewaykit.StartGateway(t, cfg)
	// A bypassed request an SDK may retry (its retry is paired with it).
	bypassed := map[string]string{"X-Allow-Duplicate": "true", "x-stainless-retry-count": "0"}
	type dedup struct {
		JobID       string   `json:"job_id"`
		Arrived     string   `json:"arrived"`
		Rules       []string `json:"rules"`
		WindowUntil string   `json:"auto_window_until"`
	}
	get := func(t *testing.T, gw *gatewaykit.Gateway, path string) dedup {
		t.Helper()
		resp, err := gatewaykit.Client().Get(gw.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct {
			Dedup *dedup `json:"dedup"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK || v.Dedup == nil {
			t.Fatalf("GET %s: %d, %v, dedup %v", path, resp.StatusCode, err, v.Dedup)
		}
		return *v.Dedup
	}
	cases := []struct {
		name   string
		gw     *gatewaykit.Gateway
		header map[string]string
		rules  string
		window bool
		// outcome is the request's own ("": created).
		outcome string
	}{
		{name: "client key", gw: plain, header: map[string]string{"Idempotency-Key": "status-why"}, rules: "idempotency_key"},
		{name: "auto key", gw: plain, header: map[string]string{}, rules: "auto_key_window,sdk_retry_header", window: true},
		{name: "auto key, retry headers configured", gw: withRetryHeaders, header: map[string]string{},
			rules: "auto_key_window,sdk_retry_header,retry_header", window: true},
		{name: "bypassed", gw: plain, header: bypassed, outcome: "bypassed", rules: "sdk_retry_header"},
		{name: "bypassed, retry headers configured", gw: withRetryHeaders, header: bypassed, outcome: "bypassed",
			rules: "sdk_retry_header,retry_header"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gw := tc.gw
			before := time.Now()
			a := postChat(t, gw, fmt.Sprintf(`{"model":"oncegate-mock","messages":[{"role":"user","content":"status %s"}]}`, tc.name), tc.header)
			after := time.Now()
			if want := cmp.Or(tc.outcome, "created"); a.status != http.StatusOK || a.outcome != want {
				t.Fatalf("%d %q: %s", a.status, a.outcome, a.body)
			}
			paths := []string{"/v1/jobs/" + a.job}
			if a.key != "" {
				paths = append(paths, "/v1/idempotency/"+url.PathEscape(a.key))
			}
			for _, path := range paths {
				d := get(t, gw, path)
				if d.JobID != a.job || strings.Join(d.Rules, ",") != tc.rules {
					t.Errorf("%s: job %s rules %v, want %s %s", path, d.JobID, d.Rules, a.job, tc.rules)
				}
				arrived, err := time.Parse(time.RFC3339Nano, d.Arrived)
				if err != nil || arrived.Before(before.Add(-time.Millisecond)) || arrived.After(after) {
					t.Errorf("%s: arrived %q (%v), want within [%s, %s]", path, d.Arrived, err, before, after)
				}
				until, err := time.Parse(time.RFC3339Nano, d.WindowUntil)
				switch {
				case tc.window && (err != nil || until.Sub(arrived) < gw.Cfg.Idempotency.AutoWindow.D()):
					t.Errorf("%s: auto_window_until %q, want the arrival + %s or later", path, d.WindowUntil, gw.Cfg.Idempotency.AutoWindow.D())
				case !tc.window && d.WindowUntil != "":
					t.Errorf("%s: auto_window_until %q on a client's key", path, d.WindowUntil)
				}
			}
		})
	}
}

// TestDedupReasonJoined: a copy that joins a live execution (not a replay) is told the same.
func TestDedupReasonJoined(t *testing.T) {
	gw := gatewaykit.StartGateway(t, nil)
	b := `{"model":"oncegate-mock-slow","messages":[{"role":"user","content":"dedup reason joined"}]}`
	type result struct {
		a   dedupAnswer
		err error
	}
	firstDone := make(chan result, 1)
	go func() {
		a, err := doChat(gw, b, map[string]string{"Idempotency-Key": "why-joined"})
		firstDone <- result{a, err}
	}()
	// The first request's record exists once its status answers 200.
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		resp, err := gatewaykit.Client().Get(gw.URL + "/v1/idempotency/why-joined")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status of the first request's key: %d", resp.StatusCode)
		}
		return nil
	})
	copyOf := postChat(t, gw, b, map[string]string{"Idempotency-Key": "why-joined", "Oncegate-Dedup-Reason": "true"})
	r := testkit.RequireChanRead(t, firstDone, 30*time.Second)
	if r.err != nil {
		t.Fatal(r.err)
	}
	first := r.a
	if first.outcome != "created" || copyOf.outcome != "joined" || copyOf.job != first.job {
		t.Fatalf("first %q job %s, copy %q job %s: want created, then joined to the same job", first.outcome, first.job, copyOf.outcome, copyOf.job)
	}
	if got := parseReason(t, copyOf.reason); got["rule"] != "idempotency_key" || got["job"] != first.job || got["arrived"] == "" {
		t.Errorf("joined copy's reason %q, want rule=idempotency_key and job %s", copyOf.reason, first.job)
	}
	if !bytes.Equal(copyOf.body, first.body) {
		t.Errorf("the joined copy's body differs from the first's")
	}
}
