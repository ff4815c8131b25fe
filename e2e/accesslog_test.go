package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/testkit"
)

// accessLine is one access-log line as the binary writes it (zerolog JSON on stderr).
type accessLine struct {
	Message  string  `json:"message"`
	Level    string  `json:"level"`
	Route    string  `json:"route"`
	API      string  `json:"api"`
	Outcome  string  `json:"outcome"`
	Status   int     `json:"status"`
	Tenant   string  `json:"tenant"`
	KeyHash  string  `json:"idem_key_hash"`
	JobID    string  `json:"job_id"`
	Epoch    int     `json:"epoch"`
	Backend  string  `json:"backend"`
	Attempts int     `json:"attempts"`
	Bytes    int     `json:"bytes"`
	Duration float64 `json:"duration"`
	TTFT     float64 `json:"ttft"`
	TraceID  string  `json:"trace_id"`
}

// accessLines are the access-log lines in a process's log so far.
func accessLines(t *testing.T, log string) []accessLine {
	t.Helper()
	var out []accessLine
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l accessLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Message == "request" {
			out = append(out, l)
		}
	}
	return out
}

// startLoggingGateway runs the binary with one tenant, info logging and extra config lines.
func startLoggingGateway(t *testing.T, apiKey, extra string) (*proc, string) {
	t.Helper()
	addr, dir := testkit.FreeAddr(t), t.TempDir()
	cfgPath := filepath.Join(dir, "oncegate.yaml")
	cfg := fmt.Sprintf(`listen: %s
data_dir: %s
log_level: info
tenants:
  - {id: acme, api_keys_sha256: [%s]}
%s`, addr, filepath.Join(dir, "data"), sha(apiKey), extra)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "gateway", oncegateBinary(t), "serve", "--config", cfgPath)
	testkit.CheckFor(t, 20*time.Second, pollEvery, func() error {
		if r := send(http.MethodGet, "http://"+addr+"/readyz", "", nil); r.Status != http.StatusOK {
			return fmt.Errorf("gateway not ready: /readyz %d %v", r.Status, r.Err)
		}
		return nil
	})
	t.Cleanup(func() { p.sigterm(t, 20*time.Second) })
	return p, "http://" + addr
}

// TestAccessLog: every request gets one line at info with its tenant, the record key's hash,
// job, epoch, outcome, backend, attempts, status, duration, bytes, the stream's time to first
// token and the client's trace id; never the client's key, body or credential.
func TestAccessLog(t *testing.T) {
	const apiKey, rawKey, secret = "sk-access-log-test", "al-raw-key-0001", "a body no log may hold"
	p, base := startLoggingGateway(t, apiKey, "")
	auth := "Bearer " + apiKey
	hdr := func(key string) map[string]string {
		return map[string]string{"Authorization": auth, "Idempotency-Key": key, "traceparent": clientTP}
	}
	body := chatBody("oncegate-mock", secret, "")
	created := postChat(t, base, body, hdr(rawKey))
	replayed := postChat(t, base, body, hdr(rawKey))
	stream := postChat(t, base, chatBody("oncegate-mock", secret, `"stream":true`), hdr(rawKey+"-stream"))
	conflict := postChat(t, base, chatBody("oncegate-mock", secret+" changed", ""), hdr(rawKey))
	bad := postChat(t, base, `{"model":`, hdr("al-bad"))
	for _, r := range []struct {
		r    result
		want int
	}{{created, 200}, {replayed, 200}, {stream, 200}, {conflict, 422}, {bad, 400}} {
		if r.r.Status != r.want {
			t.Fatalf("status %d, want %d: %s", r.r.Status, r.want, r.r.Body)
		}
	}

	var lines []accessLine
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		if lines = accessLines(t, p.log.String()); len(lines) != 5 {
			return fmt.Errorf("%d access-log lines, want 5 (one per request)", len(lines))
		}
		return nil
	})
	byOutcome := map[string][]accessLine{}
	for _, l := range lines {
		byOutcome[l.Outcome] = append(byOutcome[l.Outcome], l)
		if l.Level != "info" || l.TraceID != traceID || l.Route != "chat" || l.API != "openai" || l.Duration <= 0 {
			t.Errorf("line %+v: want level info, the client's trace id, route chat, api openai, a duration", l)
		}
		if l.Outcome != "rejected" && l.Tenant != "acme" {
			t.Errorf("line %+v: tenant %q, want acme", l, l.Tenant)
		}
	}
	c, r, s := byOutcome["created"], byOutcome["replayed"], byOutcome["conflict"]
	if len(c) != 2 || len(r) != 1 || len(s) != 1 || len(byOutcome["rejected"]) != 1 {
		t.Fatalf("outcomes %v: want 2 created, 1 replayed, 1 conflict, 1 rejected", byOutcome)
	}
	plain, streamed := c[0], c[1]
	if plain.TTFT > 0 {
		plain, streamed = streamed, plain
	}
	if plain.JobID != created.Header.Get("Oncegate-Job-Id") || plain.Epoch != 1 || plain.Status != 200 || plain.Backend != "mock" ||
		plain.Attempts != 1 || plain.Bytes != len(created.Body) || plain.KeyHash == "" {
		t.Errorf("created line %+v: want job %s epoch 1 status 200 backend mock attempts 1 bytes %d and a key hash",
			plain, created.Header.Get("Oncegate-Job-Id"), len(created.Body))
	}
	if streamed.TTFT <= 0 || streamed.Bytes != len(stream.Body) || streamed.JobID != stream.Header.Get("Oncegate-Job-Id") {
		t.Errorf("streamed line %+v: want a time to first token, bytes %d, job %s", streamed, len(stream.Body), stream.Header.Get("Oncegate-Job-Id"))
	}
	if r[0].JobID != plain.JobID || r[0].KeyHash != plain.KeyHash || r[0].Bytes != len(replayed.Body) {
		t.Errorf("replayed line %+v: want the created one's job and key hash, bytes %d", r[0], len(replayed.Body))
	}
	if s[0].Status != 422 {
		t.Errorf("conflict line %+v: want status 422", s[0])
	}
	log := p.log.String()
	for _, never := range []string{rawKey, secret, apiKey} {
		if strings.Contains(log, never) {
			t.Errorf("the log holds %q", never)
		}
	}
}

// TestAccessLogSampled: with http.access_log_sample 0 no 2xx request is logged (the other
// lines still are).
func TestAccessLogSampled(t *testing.T) {
	const apiKey = "sk-access-log-sampled"
	p, base := startLoggingGateway(t, apiKey, "http: {access_log_sample: 0}\n")
	r := postChat(t, base, chatBody("oncegate-mock", "not logged", ""), map[string]string{"Authorization": "Bearer " + apiKey})
	if r.Status != http.StatusOK {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	log := p.log.String()
	if n := len(accessLines(t, log)); n != 0 {
		t.Fatalf("%d access-log lines with access_log_sample 0", n)
	}
	if !strings.Contains(log, "HTTP API serving") {
		t.Fatalf("no info line at all: the process logs nothing?\n%s", log)
	}
}

// TestAccessLogSampledKeepsFailures: with http.access_log_sample 0 a failure (5xx) is still
// written, but a shed (503 overloaded) is not: it is sampled like a 429, so a flood of them
// cannot grow the log with the flood.
func TestAccessLogSampledKeepsFailures(t *testing.T) {
	const apiKey = "sk-access-log-failures"
	p, base := startLoggingGateway(t, apiKey, "http: {access_log_sample: 0}\nadmission: {max_executions: 1}\n")
	hdr := func(key string) map[string]string {
		return map[string]string{"Authorization": "Bearer " + apiKey, "Idempotency-Key": key}
	}
	// One live execution fills the node (about 2 s of tokens).
	resp, err := openStream(http.MethodPost, base+chatPath,
		chatBody("oncegate-mock", "fills the node", `"stream":true,"mock":{"tokens":50,"inter_token_ms":40}`), hdr("al-live"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("live stream: status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("live stream: %v", err)
	}
	shed := postChat(t, base, chatBody("oncegate-mock", "shed", ""), hdr("al-shed"))
	expectShed(t, shed)
	if _, err := br.WriteTo(discard{}); err != nil {
		t.Fatalf("live stream: %v", err)
	}
	failed := postChat(t, base, chatBody("oncegate-mock", "fails", `"mock":{"fault":"error_500"}`), hdr("al-failed"))
	if failed.Status < 500 {
		t.Fatalf("a backend's 500: status %d, want a 5xx: %s", failed.Status, failed.Body)
	}

	var lines []accessLine
	testkit.CheckFor(t, 10*time.Second, pollEvery, func() error {
		if lines = accessLines(t, p.log.String()); len(lines) == 0 {
			return fmt.Errorf("no access-log line: the failure's must be written")
		}
		return nil
	})
	if len(lines) != 1 || lines[0].Status != failed.Status {
		t.Fatalf("access-log lines %+v with access_log_sample 0: want the failure's alone (status %d), not the stream's or the shed's",
			lines, failed.Status)
	}
}
