package bench

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"
)

func TestCheckTarget(t *testing.T) {
	fake := func(_ context.Context, host string) ([]net.IPAddr, error) {
		switch host {
		case "lo.test":
			return []net.IPAddr{{IP: net.ParseIP("127.0.0.1")}, {IP: net.ParseIP("::1")}}, nil
		case "mixed.test":
			return []net.IPAddr{{IP: net.ParseIP("127.0.0.1")}, {IP: net.ParseIP("192.0.2.1")}}, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	tests := []struct {
		name        string
		url         string
		allowRemote bool
		lookup      LookupFunc
		want        error
	}{
		{"127.0.0.1", "http://127.0.0.1:8080", false, nil, nil},
		{"127.1.2.3", "http://127.1.2.3:8080", false, nil, nil},
		{"localhost", "http://localhost:8080", false, nil, nil},
		{"LOCALHOST https", "https://LOCALHOST", false, nil, nil},
		{"[::1]", "http://[::1]:8080", false, nil, nil},
		{"name resolving to loopback only", "http://lo.test:8080", false, fake, nil},
		{"10.0.0.1 refused", "http://10.0.0.1:8080", false, nil, ErrNotLoopback},
		{"0.0.0.0 refused", "http://0.0.0.0:8080", false, nil, ErrNotLoopback},
		{"[::] refused", "http://[::]:8080", false, nil, ErrNotLoopback},
		{"example.com refused", "http://example.com", false, nil, ErrNotLoopback},
		{"name with one public address refused", "http://mixed.test", false, fake, ErrNotLoopback},
		{"unresolvable refused", "http://nowhere.test", false, fake, ErrNotLoopback},
		{"10.0.0.1 with --allow-remote", "http://10.0.0.1:8080", true, nil, nil},
		{"example.com with --allow-remote", "https://example.com", true, nil, nil},
		{"no scheme", "127.0.0.1:8080", false, nil, ErrBadURL},
		{"ftp", "ftp://127.0.0.1/", false, nil, ErrBadURL},
		{"garbage", "http://[::1", false, nil, ErrBadURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckTarget(context.Background(), tt.url, tt.allowRemote, tt.lookup)
			if tt.want == nil && err != nil {
				t.Fatalf("CheckTarget(%q) = %v, want nil", tt.url, err)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("CheckTarget(%q) = %v, want %v", tt.url, err, tt.want)
			}
		})
	}
}

func TestLoopbackOnlyDialer(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:80": true, "[::1]:80": true, "10.0.0.1:80": false, "[2001:db8::1]:80": false, "nonsense": false} {
		if err := loopbackOnly("tcp", addr, nil); (err == nil) != ok {
			t.Errorf("loopbackOnly(%s) = %v, want ok=%t", addr, err, ok)
		}
	}
}

func TestParseRetryHints(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name string
		hdr  map[string]string
		want retryHints
	}{
		{"none", nil, retryHints{}},
		{"x-should-retry", map[string]string{"X-Should-Retry": "TRUE"}, retryHints{shouldRetry: "true"}},
		{"retry-after-ms wins", map[string]string{"Retry-After-Ms": "500", "Retry-After": "1"}, retryHints{after: 500 * time.Millisecond, hasAfter: true}},
		{"retry-after-ms float", map[string]string{"Retry-After-Ms": "12.5"}, retryHints{after: 12500 * time.Microsecond, hasAfter: true}},
		{"Retry-After seconds", map[string]string{"Retry-After": "2"}, retryHints{after: 2 * time.Second, hasAfter: true}},
		{"Retry-After float", map[string]string{"Retry-After": "0.25"}, retryHints{after: 250 * time.Millisecond, hasAfter: true}},
		{"Retry-After date", map[string]string{"Retry-After": now.Add(3 * time.Second).Format(http.TimeFormat)}, retryHints{after: 3 * time.Second, hasAfter: true}},
		{"bad values ignored", map[string]string{"Retry-After-Ms": "soon", "Retry-After": "later"}, retryHints{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.hdr {
				h.Set(k, v)
			}
			if got := parseRetryHints(h, now); got != tt.want {
				t.Errorf("parseRetryHints = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRetryDelay(t *testing.T) {
	after := func(d time.Duration) retryHints { return retryHints{after: d, hasAfter: true} }
	tests := []struct {
		name   string
		h      retryHints
		n      int
		jitter float64
		want   time.Duration
	}{
		{"first retry, no jitter", retryHints{}, 0, 0, 500 * time.Millisecond},
		{"second retry, no jitter", retryHints{}, 1, 0, time.Second},
		{"first retry, full jitter", retryHints{}, 0, 1, 375 * time.Millisecond},
		{"capped at 8s", retryHints{}, 10, 0, 8 * time.Second},
		{"capped, full jitter", retryHints{}, 10, 1, 6 * time.Second},
		{"server says 500ms", after(500 * time.Millisecond), 1, 0.9, 500 * time.Millisecond},
		{"server says 60s", after(time.Minute), 0, 0, time.Minute},
		{"server says 61s: backoff", after(61 * time.Second), 0, 0, 500 * time.Millisecond},
		{"server says 0: backoff", after(0), 1, 0, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryDelay(tt.h, tt.n, tt.jitter); got != tt.want {
				t.Errorf("retryDelay = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestShouldRetry(t *testing.T) {
	tests := []struct {
		name   string
		o      outcome
		stream bool
		want   bool
	}{
		{"timeout before headers", outcome{kind: KindTimeout}, false, true},
		{"refused", outcome{kind: KindConnRefused}, true, true},
		{"canceled run", outcome{kind: KindCanceled}, false, false},
		{"408", outcome{status: 408, kind: KindHTTP4xx}, false, true},
		{"409", outcome{status: 409, kind: KindHTTP4xx}, false, true},
		{"429", outcome{status: 429, kind: KindHTTP4xx}, false, true},
		{"500", outcome{status: 500, kind: KindHTTP5xx}, false, true},
		{"400", outcome{status: 400, kind: KindHTTP4xx}, false, false},
		{"422", outcome{status: 422, kind: KindHTTP4xx}, false, false},
		{"502 with x-should-retry false", outcome{status: 502, kind: KindHTTP5xx, hints: retryHints{shouldRetry: "false"}}, false, false},
		{"400 with x-should-retry true", outcome{status: 400, kind: KindHTTP4xx, hints: retryHints{shouldRetry: "true"}}, false, true},
		{"non-stream body cut", outcome{status: 200, kind: KindTruncated}, false, true},
		{"stream cut after 200", outcome{status: 200, kind: KindTruncated}, true, false},
		{"stream idle timeout after 200", outcome{status: 200, kind: KindTimeout, hints: retryHints{shouldRetry: "true"}}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := shouldRetry(&tt.o, tt.stream); got != tt.want {
				t.Errorf("shouldRetry = %t, want %t", got, tt.want)
			}
		})
	}
}
