package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid matches (errors.Is) every error caused by the configuration's
// content: YAML errors from [Load] and [Parse], and [*ValidationError].
var ErrInvalid = errors.New("config: invalid")

// FieldError is one validation problem.
type FieldError struct {
	Path    string // e.g. "backends[1].base_url", "routes[0].backends[2]"
	Message string
}

// Error returns "path: message".
func (e FieldError) Error() string {
	if e.Path == "" {
		return e.Message
	}
	return e.Path + ": " + e.Message
}

// ValidationError lists every validation problem of a configuration.
type ValidationError struct {
	Errors []FieldError
}

// Error returns one line per field error, sorted by path (indexes compare
// numerically, so backends[2] comes before backends[10]).
func (e *ValidationError) Error() string {
	errs := slices.Clone(e.Errors)
	sortFieldErrors(errs)
	lines := make([]string, len(errs))
	for i, fe := range errs {
		lines[i] = fe.Error()
	}
	return strings.Join(lines, "\n")
}

// Is reports whether target is [ErrInvalid].
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

func sortFieldErrors(errs []FieldError) {
	slices.SortStableFunc(errs, func(a, b FieldError) int { return comparePaths(a.Path, b.Path) })
}

// comparePaths orders paths bytewise except that runs of digits compare by
// numeric value.
func comparePaths(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			da, db := digitRun(a), digitRun(b)
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if c := len(na) - len(nb); c != 0 {
				return c
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return int(a[0]) - int(b[0])
		}
		a, b = a[1:], b[1:]
	}
	return len(a) - len(b)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func digitRun(s string) int {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return i
}

const (
	mib = 1 << 20

	minNATSPayload = 1 * mib
	maxNATSPayload = 64 * mib
	maxBodyBytes   = 64 * mib
	maxReplayCache = 4096 * mib
	maxChunkLinger = time.Second

	maxConcurrency = 100000
	maxMockTokens  = 100000

	minTTL   = time.Second
	minLease = 2 * time.Second
)

var (
	backendNameRE = regexp.MustCompile(`^[a-z0-9_-]+$`)
	envNameRE     = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)
	tenantIDRE    = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
	sha256HexRE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// validator collects field errors.
type validator struct {
	errs []FieldError
}

func (v *validator) add(path, format string, args ...any) {
	v.errs = append(v.errs, FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
}

// Validate checks every rule and returns nil or a [*ValidationError] listing
// all problems, sorted by path.
func (c *Config) Validate() error {
	v := &validator{}
	v.top(c)
	v.nats(&c.NATS)
	v.natsCluster(&c.NATS)
	v.http(&c.HTTP)
	v.workers(&c.Workers)
	v.idempotency(&c.Idempotency)
	v.admission(&c.Admission, c.HTTP.MaxBodyBytes)
	v.backends(c.Backends)
	v.routes(c.Routes, c.Backends)
	v.tenants(c.Tenants, c.Admission.APINodes, len(c.Admin.APIKeysSHA256) > 0)
	v.ledger(&c.Ledger)
	v.admin(&c.Admin)
	v.tracing(&c.Tracing)
	if len(v.errs) == 0 {
		return nil
	}
	sortFieldErrors(v.errs)
	return &ValidationError{Errors: v.errs}
}

func (v *validator) top(c *Config) {
	v.hostPort("listen", c.Listen)
	if c.Metrics.Listen != "" {
		v.hostPort("metrics.listen", c.Metrics.Listen)
	}
	if c.DataDir == "" && c.NATS.URL == "" {
		v.add("data_dir", "must not be empty when the embedded NATS server is used (nats.url is empty)")
	}
	v.oneOf("log_level", c.LogLevel, "debug", "info", "warn", "error")
	v.oneOf("role", c.Role, "all", "api", "worker")
	// An api-only process on an embedded server that listens nowhere accepts requests that no
	// worker can ever take: its JOBS stream is reachable from this process only.
	// With an embedded cluster the other nodes reach this one's streams over the routes.
	unreachable := c.NATS.URL == "" && c.NATS.Listen == "" && !c.NATS.Cluster.Enabled()
	if c.Role == "api" && unreachable {
		v.add("role", `"api" runs no workers and the embedded NATS server has no network port, so no worker could ever connect: pass --nats-listen ADDR (nats.listen) or --nats-url URL (nats.url)`)
	}
	if c.Role == "worker" && unreachable {
		v.add("role", `"worker" serves no API and the embedded NATS server has no network port, so no request could ever reach these workers: pass --nats-listen ADDR (nats.listen) or --nats-url URL (nats.url)`)
	}
}

func (v *validator) nats(n *NATS) {
	if n.URL != "" {
		// Like the NATS client, accept a comma-separated list of servers.
		for _, u := range strings.Split(n.URL, ",") {
			if msg := checkNATSURL(strings.TrimSpace(u)); msg != "" {
				v.add("nats.url", "%s", msg)
				break
			}
		}
	}
	if n.Listen != "" {
		v.hostPort("nats.listen", n.Listen)
	}
	if n.Sync != "always" && n.Sync != SyncAuto {
		if d, err := time.ParseDuration(n.Sync); err != nil || d <= 0 {
			v.add("nats.sync", `must be "auto", "always" or a positive duration like "1s", got %q`, n.Sync)
		}
	}
	switch n.Replicas {
	case 0, 1, 3, 5: // 0: chosen from the cluster's size at start
	default:
		// Raft needs an odd count to keep a majority through a loss; NATS allows at most 5.
		v.add("nats.replicas", "must be 1, 3 or 5 (or 0: 1 on a single server, 3 on a cluster of 3 or more), got %d", n.Replicas)
	}
	if n.Partitions < 0 || n.Partitions > maxPartitions {
		v.add("nats.partitions", "must be between 1 and %d (0: 1), got %d", maxPartitions, n.Partitions)
	}
	if n.PlacePartitions && n.Partitions <= 1 {
		v.add("nats.place_partitions", "needs nats.partitions above 1")
	}
	if n.MaxPayload < minNATSPayload || n.MaxPayload > maxNATSPayload {
		v.add("nats.max_payload", "must be between %d (1 MiB) and %d (64 MiB), got %d",
			minNATSPayload, maxNATSPayload, n.MaxPayload)
	}
}

// clusterNameRE is what nats-server takes as a cluster or server name (no spaces), kept to
// characters that need no quoting in a shell or a log.
// maxPartitions is partition.Max (config is a leaf and does not import it).
const maxPartitions = 32

var clusterNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// natsCluster checks nats.cluster: all of name, listen and routes, for the embedded server only.
func (v *validator) natsCluster(n *NATS) {
	c := &n.Cluster
	if !c.Enabled() {
		return
	}
	if n.URL != "" {
		v.add("nats.cluster", "forms a cluster of embedded servers, but nats.url is set (an external NATS is its own cluster): drop --nats-url (nats.url) or the --nats-cluster flags (nats.cluster)")
		return
	}
	var missing []string
	for _, m := range []struct {
		unset bool
		flag  string
	}{
		{c.Name == "", "--nats-cluster NAME (nats.cluster.name)"},
		{c.Listen == "", "--nats-cluster-listen HOST:PORT (nats.cluster.listen)"},
		{len(c.Routes) == 0, "--nats-routes URL,URL,... (nats.cluster.routes)"},
	} {
		if m.unset {
			missing = append(missing, m.flag)
		}
	}
	if len(missing) > 0 {
		v.add("nats.cluster", "a cluster node needs a name, a route listen address and the routes; missing %s", strings.Join(missing, ", "))
		return
	}
	if !clusterNameRE.MatchString(c.Name) {
		v.add("nats.cluster.name", "must be letters, digits, '_', '.' or '-', got %q", c.Name)
	}
	if c.ServerName != "" && !clusterNameRE.MatchString(c.ServerName) {
		v.add("nats.cluster.server_name", "must be letters, digits, '_', '.' or '-', got %q", c.ServerName)
	}
	before := len(v.errs)
	if c.Listen == n.Listen {
		v.add("nats.cluster.listen", "must differ from nats.listen (%s): routes and clients need their own ports", n.Listen)
	} else if _, port, err := net.SplitHostPort(c.Listen); err == nil && port == "0" {
		v.add("nats.cluster.listen", "needs a fixed port, not 0: the other nodes' routes name it")
	} else {
		v.hostPort("nats.cluster.listen", c.Listen)
	}
	v.natsRoutes(c, len(v.errs) == before)
}

// natsRoutes checks the route list. JetStream sizes its meta group from the number of routes
// (nats-server's bootstrapRaftNode), so every node must list all nodes, itself included.
// listenOK says whether c.Listen passed, so it can be looked for among the routes.
func (v *validator) natsRoutes(c *NATSCluster, listenOK bool) {
	const fix = "pass --nats-routes with every node's route URL, this one included, e.g. nats://10.0.0.1:6222,nats://10.0.0.2:6222,nats://10.0.0.3:6222"
	seen := map[string]bool{}
	var hosts []string
	for i, r := range c.Routes {
		p := fmt.Sprintf("nats.cluster.routes[%d]", i)
		u, err := url.Parse(strings.TrimSpace(r))
		if err != nil || !slices.Contains([]string{"nats", "nats-route", "tls"}, u.Scheme) || u.Port() == "" || u.Hostname() == "" {
			v.add(p, "must be a route URL nats://HOST:PORT, got %q", r)
			return
		}
		if n, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || n == 0 {
			v.add(p, "port must be a number between 1 and 65535, got %q", u.Port())
			return
		}
		if seen[u.Host] {
			v.add(p, "names %s twice", u.Host)
			return
		}
		seen[u.Host] = true
		hosts = append(hosts, u.Host)
	}
	if len(c.Routes) < 2 {
		v.add("nats.cluster.routes", "names one node: a cluster needs at least two (three to survive a failure); %s", fix)
		return
	}
	if !listenOK {
		return
	}
	// Only decidable when every address is an IP: a name may resolve to this node.
	host, port, err := net.SplitHostPort(c.Listen)
	if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsUnspecified() {
		return
	}
	self := false
	for _, hp := range hosts {
		h, p, _ := net.SplitHostPort(hp)
		ip := net.ParseIP(h)
		if ip == nil {
			return
		}
		self = self || ip.Equal(net.ParseIP(host)) && p == port
	}
	if !self {
		v.add("nats.cluster.routes", "does not name this node (nats.cluster.listen %s): the JetStream meta group sizes itself from the routes; %s", c.Listen, fix)
	}
}

func checkNATSURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || s == "" {
		return fmt.Sprintf("must be empty (embedded server) or a nats://, tls://, ws:// or wss:// URL, got %q", s)
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
	default:
		return fmt.Sprintf("must be empty (embedded server) or a nats://, tls://, ws:// or wss:// URL, got %q", s)
	}
	if u.Host == "" {
		return fmt.Sprintf("URL %q has no host", s)
	}
	return ""
}

func (v *validator) http(h *HTTP) {
	if h.AccessLogSample < 0 || h.AccessLogSample > 1 {
		v.add("http.access_log_sample", "must be between 0 (no access log) and 1 (every request), got %g", h.AccessLogSample)
	}
	if h.MaxBodyBytes <= 0 || h.MaxBodyBytes > maxBodyBytes {
		v.add("http.max_body_bytes", "must be > 0 and at most %d (64 MiB), got %d", maxBodyBytes, h.MaxBodyBytes)
	}
	v.positive("http.read_timeout", h.ReadTimeout)
	v.positive("http.write_timeout", h.WriteTimeout)
	v.positive("http.idle_timeout", h.IdleTimeout)
	v.positive("http.shutdown_grace", h.ShutdownGrace)
	switch {
	case h.TLSCert != "" && h.TLSKey == "":
		v.add("http.tls_key", "must be set with http.tls_cert (--tls-key with --tls-cert)")
	case h.TLSCert == "" && h.TLSKey != "":
		v.add("http.tls_cert", "must be set with http.tls_key (--tls-cert with --tls-key)")
	}
}

func (v *validator) workers(w *Workers) {
	if w.Concurrency < 1 || w.Concurrency > maxConcurrency {
		v.add("workers.concurrency", "must be between 1 and %d, got %d", maxConcurrency, w.Concurrency)
	}
	if w.SweepEvery.D() < time.Second {
		v.add("workers.sweep_every", "must be at least 1s, got %s", w.SweepEvery)
	}
	if w.ChargeGrace.D() < time.Second {
		v.add("workers.charge_grace", "must be at least 1s, got %s", w.ChargeGrace)
	}
	if w.ChunkLinger < 0 || w.ChunkLinger.D() > maxChunkLinger {
		v.add("workers.chunk_linger", "must be between 0 (off) and %s, got %s", maxChunkLinger, w.ChunkLinger)
	}
	if w.DiscardChunksAfter < 0 {
		v.add("workers.discard_chunks_after", "must be >= 0 (0 keeps chunks for the CHUNKS retention), got %s", w.DiscardChunksAfter)
	}
}

func (v *validator) idempotency(i *Idempotency) {
	if i.TTL.D() < minTTL {
		v.add("idempotency.ttl", "must be at least %s, got %s", minTTL, i.TTL)
	}
	switch {
	case i.AutoWindow < 0:
		v.add("idempotency.auto_window", "must be >= 0, got %s", i.AutoWindow)
	case i.AutoWindow >= i.TTL:
		v.add("idempotency.auto_window", "must be less than idempotency.ttl (%s), got %s", i.TTL, i.AutoWindow)
	}
	v.positive("idempotency.max_wait", i.MaxWait)
	v.hotTTL(i)
	if i.ReplayCacheBytes < 0 || i.ReplayCacheBytes > maxReplayCache {
		v.add("idempotency.replay_cache_bytes", "must be between 0 (off) and %d (4 GiB), got %d", int64(maxReplayCache), i.ReplayCacheBytes)
	}
	if i.Lease.D() < minLease {
		v.add("idempotency.lease", "must be at least %s, got %s", minLease, i.Lease)
	}
	switch {
	case i.RenewEvery <= 0:
		v.add("idempotency.renew_every", "must be > 0, got %s", i.RenewEvery)
	case i.Lease.D() < 3*i.RenewEvery.D():
		v.add("idempotency.renew_every",
			"must be at most a third of idempotency.lease (%s), got %s: the lease holder must get at least two renewal attempts before its lease can expire, or a slow renewal lets a second worker take over and execute the request again",
			i.Lease, i.RenewEvery)
	}
	for j, h := range i.RetryHeaders {
		if !isToken(h) {
			v.add(fmt.Sprintf("idempotency.retry_headers[%d]", j), "must be a valid HTTP header name, got %q", h)
		}
	}
}

// isToken reports whether s is an RFC 9110 token (a valid header name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func (v *validator) backends(bs []Backend) {
	if len(bs) == 0 {
		v.add("backends", "at least one backend is required")
		return
	}
	seen := map[string]int{}
	for i, b := range bs {
		p := fmt.Sprintf("backends[%d]", i)
		switch {
		case b.Name == "":
			v.add(p+".name", "must not be empty")
		case !backendNameRE.MatchString(b.Name):
			v.add(p+".name", "must match [a-z0-9_-]+, got %q", b.Name)
		}
		if b.Name != "" {
			if j, dup := seen[b.Name]; dup {
				v.add(p+".name", "duplicate backend name %q (also backends[%d])", b.Name, j)
			} else {
				seen[b.Name] = i
			}
		}

		switch {
		case IsHTTPType(b.Type):
			if msg := checkHTTPURL(b.BaseURL); msg != "" {
				v.add(p+".base_url", "%s", msg)
			}
		case b.Type == TypeMock:
			if b.BaseURL != "" {
				v.add(p+".base_url", "must be empty for a mock backend")
			}
		default:
			v.add(p+".type", "must be one of %s, %s, %s, %s, %s, %s, %s; got %q", TypeOpenAI, TypeAnthropic, TypeOncegate, TypeGemini, TypeAzure, TypeBedrock, TypeMock, b.Type)
		}
		switch {
		case b.Responses == "":
		case b.Responses != ResponsesNative:
			v.add(p+".responses", "must be empty (translate to chat) or %q; got %q", ResponsesNative, b.Responses)
		case b.Type != TypeOpenAI && b.Type != TypeOncegate:
			v.add(p+".responses", "%q needs a backend of type %s or %s", ResponsesNative, TypeOpenAI, TypeOncegate)
		}
		v.resilience(p, &b)
		v.passthrough(p, &b)
		v.azure(p, &b)
		v.gemini(p, &b)
		v.bedrock(p, &b)
		switch {
		case b.APIKeyEnv != "" && !envNameRE.MatchString(b.APIKeyEnv):
			v.add(p+".api_key_env", "must be an environment variable name matching [A-Z_][A-Z0-9_]* (the name of the variable holding the key, never the key itself)")
		case b.APIKeyEnv == "" && keyRequired[b.Type] != "":
			v.add(p+".api_key_env", "must be set for a backend of type %s: %s", b.Type, keyRequired[b.Type])
		}

		if len(b.Models) == 0 {
			v.add(p+".models", "must list at least one model")
		}
		models := map[string]bool{}
		for j, m := range b.Models {
			mp := fmt.Sprintf("%s.models[%d]", p, j)
			if msg := checkModelName(m); msg != "" {
				v.add(mp, "%s", msg)
				continue
			}
			if models[m] {
				v.add(mp, "duplicate model %q", m)
				continue
			}
			models[m] = true
			if b.Type == TypeMock {
				switch {
				case m == CatchAll:
					v.add(mp, "a mock backend cannot be a catch-all (%q): the mock never impersonates a real provider's model", CatchAll)
				case !strings.HasPrefix(m, MockModelPrefix):
					v.add(mp, "a mock backend may only serve model names starting with %q (the mock never impersonates a real provider's model), got %q", MockModelPrefix, m)
				}
			}
		}

		v.positive(p+".timeout", b.Timeout)
		if b.Type == TypeMock {
			if b.Mock.TTFT < 0 {
				v.add(p+".mock.ttft", "must be >= 0, got %s", b.Mock.TTFT)
			}
			if b.Mock.InterToken < 0 {
				v.add(p+".mock.inter_token", "must be >= 0, got %s", b.Mock.InterToken)
			}
			if b.Mock.Tokens < 1 || b.Mock.Tokens > maxMockTokens {
				v.add(p+".mock.tokens", "must be between 1 and %d, got %d", maxMockTokens, b.Mock.Tokens)
			}
		}
	}
}

// keyRequired says, for each backend type whose API refuses every request without a key, why
// api_key_env must be set. The other types may be keyless servers (a local vLLM, another
// oncegate, a proxy that adds the key, the mock).
var keyRequired = map[string]string{
	TypeAzure:  "Azure OpenAI refuses a request without its key (api-key header; Entra ID tokens are not supported)",
	TypeGemini: "the Gemini API refuses a request without its key (x-goog-api-key header)",
}

func checkModelName(m string) string {
	switch {
	case strings.TrimSpace(m) == "":
		return "must not be empty"
	case m != strings.TrimSpace(m):
		return fmt.Sprintf("must not have leading or trailing spaces, got %q", m)
	case m != CatchAll && strings.Contains(m, CatchAll):
		return fmt.Sprintf("patterns are not supported, got %q (use %q alone for a catch-all)", m, CatchAll)
	}
	return ""
}

func checkHTTPURL(s string) string {
	const want = "must be an absolute http(s) URL"
	if s == "" {
		return want
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Sprintf("%s, got %q", want, s)
	}
	if u.User != nil {
		return "must not contain credentials (put the key in the variable named by api_key_env)"
	}
	return ""
}

// resilience checks the timeouts, retry, continuation and breaker settings of a backend.
// Zero means "the default" (see Backend.WithDefaults); only set values are checked.
func (v *validator) resilience(p string, b *Backend) {
	for _, d := range []struct {
		path string
		val  Duration
	}{{".connect_timeout", b.ConnectTimeout}, {".first_byte_timeout", b.FirstByteTimeout}, {".retry_base", b.RetryBase},
		{".retry_cap", b.RetryCap}, {".breaker.window", b.Breaker.Window}, {".breaker.open_for", b.Breaker.OpenFor}} {
		if d.val < 0 {
			v.add(p+d.path, "must be > 0, got %s", d.val)
		}
	}
	if b.MaxAttempts < 0 || b.MaxAttempts > 10 {
		v.add(p+".max_attempts", "must be between 1 and 10, got %d", b.MaxAttempts)
	}
	if b.RetryCap != 0 && b.RetryBase != 0 && b.RetryCap < b.RetryBase {
		v.add(p+".retry_cap", "must be >= retry_base (%s), got %s", b.RetryBase, b.RetryCap)
	}
	if b.RetryBudget < 0 || b.RetryBudget > 1 {
		v.add(p+".retry_budget", "must be a fraction between 0 and 1, got %g", b.RetryBudget)
	}
	switch b.Continuation {
	case "", ContinuationVLLM:
	case ContinuationAnthropic:
		if b.Type != TypeAnthropic {
			v.add(p+".continuation", "anthropic continuation needs a backend of type anthropic")
		}
	default:
		v.add(p+".continuation", "must be empty, %q or %q; got %q", ContinuationVLLM, ContinuationAnthropic, b.Continuation)
	}
	if b.Breaker.FailureRate < 0 || b.Breaker.FailureRate > 1 {
		v.add(p+".breaker.failure_rate", "must be in (0, 1], got %g", b.Breaker.FailureRate)
	}
	if b.Breaker.MinRequests < 0 {
		v.add(p+".breaker.min_requests", "must be >= 1, got %d", b.Breaker.MinRequests)
	}
	if b.Breaker.Probes < 0 || b.Breaker.Probes > 100 {
		v.add(p+".breaker.probes", "must be between 1 and 100, got %d", b.Breaker.Probes)
	}
}

func (v *validator) routes(rs []Route, bs []Backend) {
	types := map[string]string{}
	for _, b := range bs {
		if _, ok := types[b.Name]; !ok {
			types[b.Name] = b.Type
		}
	}
	seen := map[string]int{}
	for i, r := range rs {
		p := fmt.Sprintf("routes[%d]", i)
		if msg := checkModelName(r.Model); msg != "" {
			v.add(p+".model", "%s", msg)
		} else if r.Model == CatchAll {
			v.add(p+".model", "must be an exact model name, not %q (list %q in a backend's models instead)", CatchAll, CatchAll)
		} else if j, dup := seen[r.Model]; dup {
			v.add(p+".model", "duplicate route for model %q (also routes[%d])", r.Model, j)
		} else {
			seen[r.Model] = i
		}
		if len(r.Backends) == 0 {
			v.add(p+".backends", "must name at least one backend")
		}
		names := map[string]bool{}
		for j, name := range r.Backends {
			bp := fmt.Sprintf("%s.backends[%d]", p, j)
			typ, ok := types[name]
			switch {
			case !ok:
				v.add(bp, "unknown backend %q", name)
			case names[name]:
				v.add(bp, "duplicate backend %q", name)
			case typ == TypeMock && r.Model != "" && !strings.HasPrefix(r.Model, MockModelPrefix):
				v.add(bp, "mock backend %q cannot serve model %q: the mock only serves model names starting with %q", name, r.Model, MockModelPrefix)
			}
			names[name] = true
		}
		if d := r.Degraded; d != nil && d.RetryAfter < 0 {
			v.add(p+".degraded.retry_after", "must be >= 0, got %s", d.RetryAfter)
		}
	}
}

func (v *validator) admission(a *Admission, maxBody int) {
	if a.MaxExecutions < 0 {
		v.add("admission.max_executions", "must be >= 0 (0: no bound), got %d", a.MaxExecutions)
	}
	if a.MaxQueueWait < 0 {
		v.add("admission.max_queue_wait", "must be >= 0 (0: no bound), got %s", a.MaxQueueWait)
	}
	if a.MaxBodyBytesInFlight < 0 || (a.MaxBodyBytesInFlight > 0 && a.MaxBodyBytesInFlight < int64(maxBody)) {
		v.add("admission.max_body_bytes_in_flight", "must be 0 (no bound) or at least http.max_body_bytes (%d), got %d", maxBody, a.MaxBodyBytesInFlight)
	}
	if a.StoreWait != 0 && a.StoreWait < Duration(time.Second) {
		v.add("admission.store_wait", "must be at least 1s (0: 10s), got %s", a.StoreWait)
	}
	switch {
	case a.StoreWaitMax > Duration(10*time.Minute):
		v.add("admission.store_wait_max", "must be at most 10m (a request held longer ties up its connection for nothing), got %s", a.StoreWaitMax)
	case a.StoreWaitMax != 0 && a.StoreWaitMax < cmp.Or(a.StoreWait, Duration(10*time.Second)):
		v.add("admission.store_wait_max", "must be at least admission.store_wait (0: store_wait, no longer wait for a stated timeout), got %s", a.StoreWaitMax)
	}
	if a.APINodes < 0 || a.APINodes > maxAPINodes {
		v.add("admission.api_nodes", "must be between 1 and %d (0: 1), got %d", maxAPINodes, a.APINodes)
	}
}

// maxAPINodes bounds admission.api_nodes (a typo of a few zeros would give every node a
// share of 0).
const maxAPINodes = 1000

// limits checks a tenant's caps at p: none negative, and each at least one per API node, so
// every node's share (Limits.Share) is at least 1.
func (v *validator) limits(p string, l Limits, nodes int) {
	nodes = max(nodes, 1)
	for _, c := range []struct {
		name string
		n    int
	}{{"executions", l.Executions}, {"streams", l.Streams}, {"followers_per_job", l.FollowersPerJob}, {"tokens_per_minute", l.TokensPerMinute}} {
		switch {
		case c.n < 0:
			v.add(p+"."+c.name, "must be >= 0 (0: no cap), got %d", c.n)
		case c.n > 0 && c.n < nodes:
			v.add(p+"."+c.name, "must be 0 (no cap) or at least admission.api_nodes (%d), so every API node has a share, got %d", nodes, c.n)
		}
	}
	switch {
	case l.RequestsPerSecond < 0 || math.IsNaN(l.RequestsPerSecond) || math.IsInf(l.RequestsPerSecond, 0):
		v.add(p+".requests_per_second", "must be >= 0 (0: no cap), got %g", l.RequestsPerSecond)
	case l.Burst < 0:
		v.add(p+".burst", "must be >= 0 (0: the rate rounded up), got %d", l.Burst)
	case l.Burst > 0 && l.RequestsPerSecond == 0:
		v.add(p+".burst", "needs requests_per_second")
	case l.RequestsPerSecond > 0 && l.burst() < nodes:
		v.add(p+".burst", "must be at least admission.api_nodes (%d), so every API node has a share, got %d", nodes, l.burst())
	}
}

// tenants checks the tenants; runtimeKeys (an admin key is configured) lets a tenant list no
// key: its keys are then added at run time (oncegate key add, docs/operations/api-keys.md).
func (v *validator) tenants(ts []Tenant, nodes int, runtimeKeys bool) {
	ids := map[string]int{}
	keys := map[string]string{} // key -> path of first use
	for i, t := range ts {
		p := fmt.Sprintf("tenants[%d]", i)
		switch {
		case t.ID == "":
			v.add(p+".id", "must not be empty")
		case !tenantIDRE.MatchString(t.ID):
			v.add(p+".id", "must match [A-Za-z0-9_.-]+, got %q", t.ID)
		}
		if t.ID != "" {
			if j, dup := ids[t.ID]; dup {
				v.add(p+".id", "duplicate tenant id %q (also tenants[%d])", t.ID, j)
			} else {
				ids[t.ID] = i
			}
		}
		if len(t.APIKeysSHA256) == 0 && !runtimeKeys {
			v.add(p+".api_keys_sha256", "must list at least one key hash (or configure admin.api_keys_sha256 and add keys at run time: oncegate key add)")
		}
		for j, k := range t.APIKeysSHA256 {
			kp := fmt.Sprintf("%s.api_keys_sha256[%d]", p, j)
			if !sha256HexRE.MatchString(k) {
				if len(k) != 64 {
					v.add(kp, "must be the hex sha256 of an API key: exactly 64 lowercase hex characters, got %d characters", len(k))
				} else {
					v.add(kp, "must be the hex sha256 of an API key: exactly 64 lowercase hex characters (0-9a-f)")
				}
				continue
			}
			if first, dup := keys[k]; dup {
				v.add(kp, "key hash already used by %s: a key must identify exactly one tenant", first)
				continue
			}
			keys[k] = kp
		}
		if b := t.Budget; b != nil {
			if b.Limit <= 0 {
				v.add(p+".budget.limit", "must be > 0 micro-units, got %d", b.Limit)
			}
			v.oneOf(p+".budget.period", b.Period, "day", "month")
		}
		v.limits(p+".limits", t.Limits, nodes)
	}
}

func (v *validator) ledger(l *Ledger) {
	if !currencyRE.MatchString(l.Currency) {
		v.add("ledger.currency", "must be a 3-letter upper-case currency code, got %q", l.Currency)
	}
	if l.ReconcileEvery.D() < time.Second {
		v.add("ledger.reconcile_every", "must be at least 1s, got %s", l.ReconcileEvery)
	}
	if d := l.TallyEvery.D(); d < 10*time.Millisecond || d > time.Hour {
		v.add("ledger.tally_every", "must be between 10ms and 1h, got %s", l.TallyEvery)
	}
	if l.DefaultMaxTokens < 1 {
		v.add("ledger.default_max_tokens", "must be >= 1, got %d", l.DefaultMaxTokens)
	}
	if n := len(l.Secret); n > 0 && n < MinLedgerSecret {
		// The length only: a secret is never echoed.
		v.add("ledger.secret", "must be at least %d bytes (e.g. `openssl rand -hex 32`), got %d bytes", MinLedgerSecret, n)
	}
	if len(l.RetiredSecrets) > 0 && l.Secret == "" {
		v.add("ledger.retired_secrets", "needs ledger.secret, the secret that replaced them")
	}
	for i, r := range l.RetiredSecrets {
		field := fmt.Sprintf("ledger.retired_secrets[%d]", i)
		switch {
		case len(r.Secret) < MinLedgerSecret:
			v.add(field+".secret", "must be at least %d bytes, got %d bytes", MinLedgerSecret, len(r.Secret))
		case r.Secret == l.Secret:
			v.add(field+".secret", "is the current ledger.secret: a retired secret must differ from it")
		}
		switch {
		case r.Until.IsZero():
			v.add(field+".until", "must be set: when the secret stopped signing (RFC 3339, e.g. 2026-12-04T20:00:00Z)")
		case i > 0 && !r.Until.After(l.RetiredSecrets[i-1].Until.Time):
			v.add(field+".until", "must be after the until of the secret before it (oldest first), got %s", r.Until.Format(time.RFC3339))
		}
	}
	for m, p := range l.Prices {
		if p.InputPerMillion < 0 || p.OutputPerMillion < 0 {
			v.add("ledger.prices."+m, "prices must be >= 0 micro-units per million tokens")
		}
	}
}

func (v *validator) admin(a *Admin) {
	for j, k := range a.APIKeysSHA256 {
		if !sha256HexRE.MatchString(k) {
			v.add(fmt.Sprintf("admin.api_keys_sha256[%d]", j), "must be the hex sha256 of an API key: exactly 64 lowercase hex characters")
		}
	}
}

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// hostPort checks a host:port listen address with a numeric port.
func (v *validator) hostPort(path, addr string) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.add(path, "must be host:port, got %q", addr)
		return
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		v.add(path, "port must be a number between 0 and 65535, got %q", port)
	}
}

func (v *validator) oneOf(path, val string, allowed ...string) {
	if !slices.Contains(allowed, val) {
		v.add(path, "must be one of %s, got %q", strings.Join(allowed, "|"), val)
	}
}

func (v *validator) positive(path string, d Duration) {
	if d <= 0 {
		v.add(path, "must be > 0, got %s", d)
	}
}

func (v *validator) tracing(t *Tracing) {
	if t.OTLPEndpoint != "" {
		u, err := url.Parse(t.OTLPEndpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.add("tracing.otlp_endpoint", "must be an http:// or https:// URL of an OTLP/HTTP collector (e.g. http://127.0.0.1:4318), got %q", t.OTLPEndpoint)
		}
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 {
		v.add("tracing.sample_ratio", "must be between 0 and 1, got %g", t.SampleRatio)
	}
}

// minHotTTL is the least hot TTL: a running execution's record is rewritten by its lease
// renewals and so stays hot, and one the hot tier lets go must have gone without a write for
// well over a lease.
const minHotTTL = 4 * time.Second

// hotTTL checks idempotency.hot_ttl: 0 or at least the TTL (off), or between twice the lease
// and the auto window (and minHotTTL) and the TTL.
func (v *validator) hotTTL(i *Idempotency) {
	h := i.HotTTL.D()
	switch {
	case h == 0 || h >= i.TTL.D():
	case h < 0:
		v.add("idempotency.hot_ttl", "must not be negative (0: no cold tier), got %s", i.HotTTL)
	case h < max(minHotTTL, 2*i.Lease.D(), 2*i.AutoWindow.D()):
		v.add("idempotency.hot_ttl",
			"must be at least twice idempotency.lease (%s) and idempotency.auto_window (%s), and at least %s, got %s: a record leaves the hot tier once it has gone that long without a write",
			i.Lease, i.AutoWindow, minHotTTL, i.HotTTL)
	}
}
