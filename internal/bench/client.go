package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"hash/fnv"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNotLoopback is returned for a target (or --mock-stats URL) that is not a loopback
// address while remote targets are not allowed.
var ErrNotLoopback = errors.New("bench: not a loopback address (pass --allow-remote to load a remote host)")

// ErrBadURL is returned for a target URL that is not an absolute http(s) URL.
var ErrBadURL = errors.New("bench: bad URL")

// LookupFunc resolves a host name, like (*net.Resolver).LookupIPAddr.
type LookupFunc func(ctx context.Context, host string) ([]net.IPAddr, error)

// CheckTarget parses raw and, unless allowRemote, refuses it when its host is not loopback:
// an IP literal must be in 127.0.0.0/8 or ::1, "localhost" is accepted by name, any other
// name must resolve (with lookup, the default resolver when nil) to loopback addresses only.
// A name that does not resolve is refused.
func CheckTarget(ctx context.Context, raw string, allowRemote bool, lookup LookupFunc) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w %q: %w", ErrBadURL, raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w %q: want http://host:port or https://host:port", ErrBadURL, raw)
	}
	if allowRemote {
		return nil
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil {
		if !ip.IsLoopback() {
			return fmt.Errorf("%w: %s", ErrNotLoopback, host)
		}
		return nil
	}
	if lookup == nil {
		lookup = net.DefaultResolver.LookupIPAddr
	}
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	addrs, err := lookup(lctx, host)
	if err != nil {
		return fmt.Errorf("%w: %s does not resolve: %w", ErrNotLoopback, host, err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("%w: %s resolves to nothing", ErrNotLoopback, host)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return fmt.Errorf("%w: %s resolves to %s", ErrNotLoopback, host, a.IP)
		}
	}
	return nil
}

// loopbackOnly is a net.Dialer Control function that refuses to connect anywhere but
// loopback, so a name that resolved to loopback at check time cannot be re-pointed later.
func loopbackOnly(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrNotLoopback, address)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%w: dial %s %s", ErrNotLoopback, network, address)
	}
	return nil
}

// newClient returns the run's one HTTP client: HTTP/1.1 only, no proxy, no compression, no
// redirects, and an idle pool as large as the number of requests that can be in flight per
// host, so a closed loop reuses its connections instead of dialing.
func newClient(perHost int, allowRemote bool) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if !allowRemote {
		d.Control = loopbackOnly
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         d.DialContext,
		Protocols:           protocols,
		ForceAttemptHTTP2:   false,
		MaxIdleConns:        2*perHost + 16,
		MaxIdleConnsPerHost: perHost,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 5 * time.Second,
		DisableCompression:  true,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// attempt is one HTTP request to send.
type attempt struct {
	url        string      // the chat completions URL
	key        string      // Idempotency-Key; "" sends none
	header     http.Header // extra headers (Config.Header, the API key); shared, never written
	body       []byte
	stream     bool
	retryCount int           // x-stainless-retry-count; < 0 sends none
	idle       time.Duration // > 0: fail with ErrClientTimeout when no byte arrives for this long
	arrivals   bool          // keep the arrival time of every data line
	onFirst    func()        // called when the first data line arrives (stream)
}

// outcome is what one request did.
type outcome struct {
	status   int
	err      error
	kind     ErrorKind // "" on success
	start    time.Time
	headers  time.Time     // when the response headers arrived (zero if they never did)
	latency  time.Duration // start to end of body
	ttft     time.Duration // start to first data line (stream)
	ttlt     time.Duration // start to data: [DONE] (stream)
	chunks   int           // data lines before [DONE]
	done     bool          // [DONE] seen
	bytes    int64         // body bytes read
	digest   uint64        // FNV-1a of the body (non-stream) or of the data payloads (stream)
	arrivals []time.Time   // per data line, when attempt.arrivals
	idem     string        // Oncegate-Idempotency response header
	hints    retryHints
}

// retryHints are the response headers an SDK's retry policy reads.
type retryHints struct {
	shouldRetry string        // x-should-retry, lower case: "true", "false" or ""
	after       time.Duration // from retry-after-ms, else Retry-After
	hasAfter    bool
}

// parseRetryHints reads x-should-retry, retry-after-ms (milliseconds, float) and Retry-After
// (seconds, float, or an HTTP date), like the official SDKs.
func parseRetryHints(h http.Header, now time.Time) retryHints {
	r := retryHints{shouldRetry: strings.ToLower(strings.TrimSpace(h.Get("x-should-retry")))}
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			r.after, r.hasAfter = time.Duration(f*float64(time.Millisecond)), true
			return r
		}
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			r.after, r.hasAfter = time.Duration(f*float64(time.Second)), true
		} else if t, err := http.ParseTime(v); err == nil {
			r.after, r.hasAfter = t.Sub(now), true
		}
	}
	return r
}

// progressReader calls touch on every read that returned bytes.
type progressReader struct {
	r     io.Reader
	touch func()
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.touch()
	}
	return n, err
}

var (
	dataPrefix = []byte("data:")
	doneMarker = []byte("[DONE]")
	errorEvent = []byte(`{"error"`)
)

// do sends a and reads the whole response. It never returns early: the outcome says what
// happened, and is already classified.
func do(ctx context.Context, client *http.Client, timeout time.Duration, a attempt) (o outcome) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	touch := func() {}
	if a.idle > 0 {
		var cancelCause context.CancelCauseFunc
		ctx, cancelCause = context.WithCancelCause(ctx)
		defer cancelCause(nil)
		idle := time.AfterFunc(a.idle, func() { cancelCause(ErrClientTimeout) })
		defer idle.Stop()
		touch = func() { idle.Reset(a.idle) }
	}
	defer func() {
		if o.err != nil && errors.Is(context.Cause(ctx), ErrClientTimeout) && !errors.Is(o.err, ErrClientTimeout) {
			o.err = fmt.Errorf("%w: %w", ErrClientTimeout, o.err)
		}
		o.latency = time.Since(o.start)
		o.kind = Classify(o.status, o.err)
	}()

	o.start = time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(a.body))
	if err != nil {
		o.err = fmt.Errorf("bench: new request: %w", err)
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	if a.stream {
		req.Header.Set("Accept", "text/event-stream")
	} else {
		req.Header.Set("Accept", "application/json")
	}
	for name, values := range a.header {
		req.Header[name] = values // shared and read-only: the transport only reads it
	}
	if a.key != "" {
		req.Header.Set("Idempotency-Key", a.key)
	}
	if a.retryCount >= 0 {
		req.Header.Set("x-stainless-retry-count", strconv.Itoa(a.retryCount))
	}
	resp, err := client.Do(req)
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.headers = time.Now()
	touch()
	o.status = resp.StatusCode
	o.idem = strings.ToLower(resp.Header.Get("Oncegate-Idempotency"))
	o.hints = parseRetryHints(resp.Header, o.headers)
	body := progressReader{r: resp.Body, touch: touch}
	h := fnv.New64a()

	if resp.StatusCode != http.StatusOK || !a.stream ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		n, err := io.Copy(h, body)
		o.bytes, o.digest = n, h.Sum64()
		if err != nil {
			o.err = fmt.Errorf("bench: reading body: %w", err)
		}
		return o
	}
	o.err = readStream(body, h, a, &o)
	o.digest = h.Sum64()
	return o
}

// readStream parses SSE data lines into o until data: [DONE], then drains the body so the
// connection can be reused.
func readStream(body io.Reader, h hash.Hash64, a attempt, o *outcome) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Bytes()
		o.bytes += int64(len(line)) + 1
		if !bytes.HasPrefix(line, dataPrefix) {
			continue
		}
		now := time.Now()
		payload := bytes.TrimSpace(line[len(dataPrefix):])
		if bytes.Equal(payload, doneMarker) {
			o.ttlt, o.done = now.Sub(o.start), true
			n, _ := io.Copy(io.Discard, body) // the chunked terminator; errors after [DONE] do not matter
			o.bytes += n
			return nil
		}
		if o.chunks == 0 {
			o.ttft = now.Sub(o.start)
			if a.onFirst != nil {
				a.onFirst()
			}
		}
		o.chunks++
		h.Write(payload)
		h.Write([]byte{'\n'})
		if a.arrivals {
			o.arrivals = append(o.arrivals, now)
		}
		if bytes.HasPrefix(payload, errorEvent) {
			return fmt.Errorf("%w: %.200s", ErrStreamError, payload)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("bench: reading stream after %d chunks: %w", o.chunks, err)
	}
	return fmt.Errorf("%w: stream ended after %d chunks without [DONE]", ErrTruncated, o.chunks)
}

// statsCounter returns an execution counter that reads GET <base>/stats of an oncegate mock.
func statsCounter(client *http.Client, base string) func(context.Context) (int64, error) {
	statsURL := strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1") + "/stats"
	return func(ctx context.Context) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, statsURL, nil)
		if err != nil {
			return 0, fmt.Errorf("bench: mock stats: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, fmt.Errorf("bench: mock stats: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("bench: mock stats: GET %s: status %d", statsURL, resp.StatusCode)
		}
		var st struct {
			Requests *int64 `json:"requests"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
			return 0, fmt.Errorf("bench: mock stats: GET %s: %w", statsURL, err)
		}
		if st.Requests == nil {
			return 0, fmt.Errorf("bench: mock stats: GET %s: no \"requests\" field", statsURL)
		}
		return *st.Requests, nil
	}
}
