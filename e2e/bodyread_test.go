package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestRequestBodyReading: the gateway streams request bodies into buffers of their declared
// size (httpapi's readBody). Whatever a request's body does, the answer is the one fasthttp's
// own reading gave, and no body byte is left on the connection to be read as a request:
// a slow sender gets 408, an oversized body 413 (from its header alone, on a keep-alive
// connection too), both with the connection closed; a chunked body is read up to the limit;
// and a request refused before its route reads anything still has its body consumed, so a
// request smuggled inside that body is never answered.
func TestRequestBodyReading(t *testing.T) {
	cfg := gatewaykit.Config(t)
	cfg.HTTP.MaxBodyBytes = 16 << 10
	cfg.HTTP.ReadTimeout = config.Duration(500 * time.Millisecond)
	gw := gatewaykit.StartGateway(t, cfg)
	mock := gw.Mock(t, "mock")
	addr := strings.TrimPrefix(gw.URL, "http://")
	body := chatBody("oncegate-mock", "body reading", "")
	head := func(extra string) string {
		return "POST " + chatPath + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" + extra
	}
	chunked := func(body string) string {
		var b strings.Builder
		for len(body) > 0 {
			n := min(len(body), 1000)
			fmt.Fprintf(&b, "%x\r\n%s\r\n", n, body[:n])
			body = body[n:]
		}
		return b.String() + "0\r\n\r\n"
	}
	// A request at the end of a body: answered only if the body is left unread. fasthttp reads
	// the first 8 KiB of a body before any handler, so the padding puts it past them.
	smuggled := "GET /v1/models HTTP/1.1\r\nHost: " + addr + "\r\n\r\n"
	padded := strings.Repeat(" ", 12<<10) + smuggled
	cases := []struct {
		name     string
		send     string
		statuses []int  // every response the connection carries, in order, before it closes
		code     string // the first response's error code, when an error
	}{
		{name: "slow sender", send: head(fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body))) + body[:len(body)/2],
			statuses: []int{http.StatusRequestTimeout}, code: "request_timeout"},
		{name: "over the limit, header only, keep-alive", send: head("Content-Length: 65536\r\n\r\n"),
			statuses: []int{http.StatusRequestEntityTooLarge}, code: "request_too_large"},
		{name: "over the limit, then its body and another request", send: head("Content-Length: 20000\r\n\r\n") +
			strings.Repeat("x", 20000) + smuggled, statuses: []int{http.StatusRequestEntityTooLarge}, code: "request_too_large"},
		{name: "chunked over the limit", send: head("Transfer-Encoding: chunked\r\n\r\n") + chunked(strings.Repeat("y", 20000)),
			statuses: []int{http.StatusRequestEntityTooLarge}, code: "request_too_large"},
		{name: "chunked within the limit", send: head("Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n") + chunked(body),
			statuses: []int{http.StatusOK}},
		{name: "refused before its route, then the next request", send: "POST /v1/no-such-route HTTP/1.1\r\nHost: " + addr +
			fmt.Sprintf("\r\nContent-Length: %d\r\n\r\n", len(padded)) + padded +
			"GET /healthz HTTP/1.1\r\nHost: " + addr + "\r\nConnection: close\r\n\r\n",
			statuses: []int{http.StatusNotFound, http.StatusOK}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := mock.Stats().Requests
			got, closed := exchangeAll(t, addr, c.send)
			if !closed {
				t.Errorf("the connection was still open 10 s after the last answer")
			}
			var statuses []int
			for _, r := range got {
				statuses = append(statuses, r.Status)
			}
			if fmt.Sprint(statuses) != fmt.Sprint(c.statuses) {
				t.Fatalf("responses %v, want %v: %+v", statuses, c.statuses, got)
			}
			if c.code != "" {
				assertOpenAIError(t, got[0], c.code)
			}
			want := int64(0)
			if c.statuses[0] == http.StatusOK && strings.Contains(c.send, chatPath) {
				want = 1
			}
			if after := mock.Stats().Requests; after-before != want {
				t.Errorf("backend executions went %d -> %d, want %d more", before, after, want)
			}
		})
	}
}

// exchangeAll writes send on a new connection to addr and reads every response until the
// server closes it (closed false: it was still open 10 s after the last byte).
func exchangeAll(t testing.TB, addr, send string) (responses []result, closed bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, send); err != nil {
		t.Fatalf("write: %v", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	all, err := io.ReadAll(conn)
	closed = !errors.Is(err, os.ErrDeadlineExceeded)
	r := bufio.NewReader(bytes.NewReader(all))
	for {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			break
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		responses = append(responses, result{Status: resp.StatusCode, Header: resp.Header, Body: b})
	}
	return responses, closed
}
