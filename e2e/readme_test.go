package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeStep is one command of the README's "Try it" section and what its comment claims,
// checked on the command's output. The steps are in README order; a README with more or
// fewer commands fails the test, so a new example cannot go unchecked.
type readmeStep struct {
	prefix   string // the command starts with this
	mentions string // its comment says this (the claim the check tests)
	// note: its comment also says this, a fact about running the command rather than its
	// output (the first run's module download); "" for none.
	note  string
	check func(t *testing.T, out string)
}

// TestReadmeTryIt runs every command of the README's "Try it" section, and every command of
// docs/getting-started.md, against a started gateway (one per page), the way a reader would:
// the oncegate binary (for `go run ./cmd/oncegate`, built once, on a free loopback port and a
// temporary data dir; the page's localhost:8080 is rewritten to that address), each curl line
// with the real curl through sh -c, and the Go SDK example (for `go run ./examples/openai-go`),
// whose code must be the page's Go snippet. It checks what the comments say: the second
// identical call is replayed with the same bytes, the streamed copy and the SDK call are
// served from the same execution (one job id; the key's record says one attempt and epoch 1).
// The getting-started page is read whole: a command block added anywhere in it must be one of
// these steps, and a shell block fenced as anything but ```sh fails the test.
//
// Without curl the test skips, unless ONCEGATE_REQUIRE_TOOLS=1 (as CI sets it), where a
// missing curl fails it.
func TestReadmeTryIt(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("ONCEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatalf("curl is required (ONCEGATE_REQUIRE_TOOLS=1): %v", err)
		}
		t.Skip("curl not installed (set ONCEGATE_REQUIRE_TOOLS=1 to make this a failure)")
	}
	readme := readRepoFile(t, "README.md")
	t.Run("README.md", func(t *testing.T) { runTryIt(t, readmeSection(t, readme, "## Try it")) })
	t.Run("docs/getting-started.md", func(t *testing.T) {
		page := readRepoFile(t, "docs", "getting-started.md")
		noOtherShellFences(t, page)
		runTryIt(t, page)
	})
}

// readRepoFile is a file of the repository, by its path from the root.
func readRepoFile(t *testing.T, path ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{".."}, path...)...))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// noOtherShellFences fails on a shell block fenced as something other than ```sh, which the
// command tests would not see.
func noOtherShellFences(t *testing.T, page string) {
	t.Helper()
	for _, lang := range []string{"bash", "shell", "console", "zsh", "shell-session"} {
		if blocks := fencedBlocks(page, lang); len(blocks) > 0 {
			t.Errorf("a ```%s block: fence shell commands as ```sh, so that a test runs them:\n%s", lang, blocks[0])
		}
	}
}

// runTryIt runs the quick start's commands found in text (its sh blocks and its one Go block).
func runTryIt(t *testing.T, text string) {
	cmds := shellCommands(fencedBlocks(text, "sh"))
	goBlocks := fencedBlocks(text, "go")

	// The Go snippet is the example's code between its README markers.
	example, err := os.ReadFile(filepath.Join("..", "examples", "openai-go", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	if len(goBlocks) != 1 || goBlocks[0] != markedRegion(t, string(example)) {
		t.Fatalf("the page's Go snippet is not examples/openai-go/main.go's code between the README markers:\n--- page\n%s\n--- example\n%s",
			strings.Join(goBlocks, "\n---\n"), markedRegion(t, string(example)))
	}

	bin := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gatewayBin := oncegateBinary(t)
	// The SDK example is only this test's: built here.
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/openai-go")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/openai-go: %v\n%s", err, out)
	}

	var (
		addr      string // the gateway's host:port
		firstBody string // the first call's response body
		jobID     string // the job id the second call names
		content   string // the first call's answer text
	)
	steps := []readmeStep{
		{"go run ./cmd/oncegate", "mock model", "", func(t *testing.T, _ string) {}},
		{"curl -s ", "one chat completion", "", func(t *testing.T, out string) {
			_, text, err := answerOf([]byte(out))
			if err != nil || text == "" {
				t.Fatalf("not a chat completion with an answer (%v): %s", err, out)
			}
			firstBody, content = out, text
		}},
		{"curl -si ", "replayed", "", func(t *testing.T, out string) {
			h, body := splitHTTP(t, out)
			if h.status != http.StatusOK || h.get("Oncegate-Idempotency") != "replayed" || h.get("Idempotent-Replayed") != "true" {
				t.Errorf("status %d, Oncegate-Idempotency %q, Idempotent-Replayed %q; want 200, replayed, true",
					h.status, h.get("Oncegate-Idempotency"), h.get("Idempotent-Replayed"))
			}
			if body != firstBody {
				t.Errorf("replayed body differs from the first:\n%s\n%s", body, firstBody)
			}
			if jobID = h.get("Oncegate-Job-Id"); jobID == "" {
				t.Error("no Oncegate-Job-Id")
			}
		}},
		{"curl -siN ", "same execution", "", func(t *testing.T, out string) {
			h, body := splitHTTP(t, out)
			if h.status != http.StatusOK || !strings.HasPrefix(h.get("Content-Type"), "text/event-stream") {
				t.Errorf("status %d, Content-Type %q; want 200 SSE", h.status, h.get("Content-Type"))
			}
			if got := h.get("Oncegate-Job-Id"); got != jobID || h.get("Oncegate-Idempotency") != "replayed" {
				t.Errorf("job %q (%s); want the same execution, job %q, replayed", got, h.get("Oncegate-Idempotency"), jobID)
			}
			st := chatStreamOf(t, []byte(body))
			got, done := st.Content, st.Done
			if got != content || !done {
				t.Errorf("streamed text %q (ended with [DONE]: %v), want the same answer %q and [DONE]", got, done, content)
			}
		}},
		{"curl -s ", "one attempt", "", func(t *testing.T, out string) {
			var rec struct {
				State    string `json:"state"`
				Attempts int    `json:"attempts"`
				Epoch    int    `json:"epoch"`
				JobID    string `json:"job_id"`
			}
			if err := json.Unmarshal([]byte(out), &rec); err != nil {
				t.Fatalf("not JSON (%v): %s", err, out)
			}
			if rec.State != "COMPLETED" || rec.Attempts != 1 || rec.Epoch != 1 || rec.JobID != jobID {
				t.Errorf("record %+v: want COMPLETED, 1 attempt, epoch 1, job %s (no second execution)", rec, jobID)
			}
		}},
		{"go run ./examples/openai-go", "replayed", "first run downloads", func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 2 || lines[0] != "replayed "+jobID || lines[1] != content {
				t.Errorf("example printed %q; want %q then the answer %q", out, "replayed "+jobID, content)
			}
		}},
	}
	if len(cmds) != len(steps) {
		t.Fatalf("the page has %d commands, the test checks %d: update e2e/readme_test.go with the page:\n%s",
			len(cmds), len(steps), strings.Join(commandLines(cmds), "\n"))
	}
	for i, st := range steps {
		c := cmds[i]
		if !strings.HasPrefix(c.line, st.prefix) || !strings.Contains(c.comment, st.mentions) || !strings.Contains(c.comment, st.note) {
			t.Fatalf("command %d of the page is %q (comment %q); the test expects one starting %q whose comment says %q and %q",
				i+1, c.line, c.comment, st.prefix, st.mentions, st.note)
		}
	}

	for i, st := range steps {
		line := cmds[i].line
		switch {
		case strings.HasPrefix(line, "go run ./cmd/oncegate"):
			if line != "go run ./cmd/oncegate" {
				t.Fatalf("the gateway command %q has arguments the test does not pass", line)
			}
			addr = startGatewayBinary(t, gatewayBin)
			st.check(t, "")
		case strings.HasPrefix(line, "go run ./examples/openai-go"):
			out, err := exec.CommandContext(ctx, filepath.Join(bin, "openai-go"), "http://"+addr+"/v1").CombinedOutput()
			if err != nil {
				t.Fatalf("examples/openai-go: %v\n%s", err, out)
			}
			t.Run("openai-go", func(t *testing.T) { st.check(t, string(out)) })
		default:
			if addr == "" {
				t.Fatalf("command %q comes before the gateway is started", line)
			}
			run := strings.ReplaceAll(line, "localhost:8080", addr)
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			out, err := exec.CommandContext(cctx, "sh", "-c", run).Output()
			ccancel()
			if err != nil {
				t.Fatalf("%s: %v\n%s", run, err, out)
			}
			t.Run(fmt.Sprintf("command_%d", i+1), func(t *testing.T) { st.check(t, string(out)) })
		}
	}
}

// readmeSection returns the text from heading to the next heading of the same level.
func readmeSection(t *testing.T, readme, heading string) string {
	t.Helper()
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q section", heading)
	}
	rest := readme[i+1+len(heading):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// fencedBlocks returns the contents of the ```lang blocks of s.
func fencedBlocks(s, lang string) []string {
	re := regexp.MustCompile("(?ms)^```" + lang + "\n(.*?)^```$")
	var blocks []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		blocks = append(blocks, strings.TrimSuffix(m[1], "\n"))
	}
	return blocks
}

// shellCommand is one command of a sh block: its line (continuations joined, an inline
// comment removed) and the comment that goes with it (the lines above it, or inline).
type shellCommand struct{ line, comment string }

func shellCommands(blocks []string) []shellCommand {
	var cmds []shellCommand
	for _, b := range blocks {
		var comment []string
		var cur strings.Builder
		for _, l := range strings.Split(b, "\n") {
			trimmed := strings.TrimSpace(l)
			switch {
			case cur.Len() == 0 && trimmed == "":
				comment = nil
			case cur.Len() == 0 && strings.HasPrefix(trimmed, "#"):
				comment = append(comment, strings.TrimSpace(strings.TrimPrefix(trimmed, "#")))
			case strings.HasSuffix(trimmed, "\\"):
				cur.WriteString(strings.TrimSuffix(trimmed, "\\"))
			default:
				cur.WriteString(trimmed)
				line := cur.String()
				// An inline comment: " # " outside the quotes the examples use.
				if i := strings.Index(line, "  # "); i >= 0 && !strings.Contains(line[:i], "'") {
					comment = append(comment, strings.TrimSpace(line[i+4:]))
					line = strings.TrimSpace(line[:i])
				}
				cmds = append(cmds, shellCommand{line: line, comment: strings.Join(comment, " ")})
				cur.Reset()
				comment = nil
			}
		}
	}
	return cmds
}

func commandLines(cmds []shellCommand) []string {
	out := make([]string, len(cmds))
	for i, c := range cmds {
		out[i] = c.line
	}
	return out
}

// markedRegion is the code between "// README:begin" and "// README:end", one tab of
// indentation removed.
func markedRegion(t *testing.T, src string) string {
	t.Helper()
	_, after, ok1 := strings.Cut(src, "// README:begin\n")
	region, _, ok2 := strings.Cut(after, "\t// README:end")
	if !ok1 || !ok2 {
		t.Fatal("examples/openai-go/main.go has no README:begin/README:end markers")
	}
	lines := strings.Split(strings.TrimSuffix(region, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "\n")
}

// startGatewayBinary runs the built gateway as `oncegate` with no config, as the README
// does, on a free loopback port (--listen 127.0.0.1:0) and a temporary --data-dir, waits
// for its "HTTP API serving" log line and returns the address it names (checking, from the
// embedded NATS server's start line, that no NATS port was opened). The process gets
// SIGTERM and is waited for when the test ends.
func startGatewayBinary(t *testing.T, path string) string {
	t.Helper()
	cmd := exec.Command(path, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir())
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL=", "OPENAI_API_KEY=", "ONCEGATE_TENANTS=", "ONCEGATE_NATS_URL=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	type serving struct {
		addr     string
		natsPort *bool // the embedded server's start line: did it open a network port
	}
	addrc := make(chan serving, 1)
	var logs bytes.Buffer
	done := make(chan struct{})
	go func() { // owned: ends at EOF, when the process exits
		defer close(done)
		sc := bufio.NewScanner(stderr)
		var natsPort *bool
		for sc.Scan() {
			logs.Write(sc.Bytes())
			logs.WriteByte('\n')
			var line struct {
				Listen   string `json:"listen"`
				NATSPort *bool  `json:"nats_network_port"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			if line.NATSPort != nil {
				natsPort = line.NATSPort
			}
			if strings.HasPrefix(line.Listen, "http://") {
				select {
				case addrc <- serving{strings.TrimPrefix(line.Listen, "http://"), natsPort}:
				default:
				}
			}
		}
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		if err := cmd.Wait(); err != nil {
			t.Errorf("gateway exited: %v\n%s", err, logs.String())
		}
	}
	select {
	case sv := <-addrc:
		t.Cleanup(stop)
		if sv.natsPort == nil || *sv.natsPort {
			t.Errorf("the embedded NATS server opened a network port (or did not say): the README says none is opened")
		}
		return sv.addr
	case <-done:
		_ = cmd.Wait()
		t.Fatalf("the gateway exited before serving:\n%s", logs.String())
	case <-time.After(60 * time.Second):
		stop()
		t.Fatalf("the gateway did not log its address within 60 s:\n%s", logs.String())
	}
	return ""
}

// httpHead is the status and headers of a `curl -i` response.
type httpHead struct {
	status int
	header http.Header
}

func (h httpHead) get(k string) string { return h.header.Get(k) }

// splitHTTP splits `curl -i` output into its head and body.
func splitHTTP(t *testing.T, out string) (httpHead, string) {
	t.Helper()
	head, body, ok := strings.Cut(out, "\r\n\r\n")
	if !ok {
		t.Fatalf("not an HTTP response with headers:\n%s", out)
	}
	lines := strings.Split(head, "\r\n")
	var h httpHead
	h.header = http.Header{}
	parts := strings.Fields(lines[0])
	if len(parts) < 2 {
		t.Fatalf("bad status line %q", lines[0])
	}
	status, err := strconv.Atoi(parts[1])
	if err != nil {
		t.Fatalf("bad status line %q", lines[0])
	}
	h.status = status
	for _, l := range lines[1:] {
		if k, v, ok := strings.Cut(l, ":"); ok {
			h.header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	return h, body
}
