// Package config loads, defaults, overrides from the environment and validates
// oncegate's YAML configuration.
//
// The life of a configuration is:
//
//  1. [Default] builds a complete, valid configuration: listen on
//     127.0.0.1:8080, embedded NATS in ./data, and a single built-in mock
//     backend serving the model "oncegate-mock".
//  2. [Load] (or [Parse]) decodes YAML over those defaults. Keys are snake_case,
//     durations are Go duration strings ("3s", "150ms") and unknown keys are
//     errors. A list given in YAML (backends, routes, tenants, ...) replaces the
//     default list; fields omitted from a backend entry get the backend
//     defaults (timeout 120s, mock tokens 16).
//  3. [Config.ApplyEnv] applies ONCEGATE_* overrides and the
//     OPENAI_BASE_URL/OPENAI_API_KEY convenience backend.
//  4. [Config.Validate] checks every rule and reports all problems at once as a
//     [*ValidationError], which matches [ErrInvalid] with errors.Is.
//
// [Config.Resolve] and [Config.ModelNames] turn the backends and routes into the
// routing table used by the HTTP API.
package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// Backend types.
const (
	TypeOpenAI    = "openai"    // an OpenAI-compatible HTTP API (OpenAI, vLLM, llama.cpp, ...)
	TypeAnthropic = "anthropic" // the Anthropic Messages API
	TypeOncegate  = "oncegate"  // another oncegate (gateway in front of gateway)
	TypeMock      = "mock"      // the built-in deterministic mock, for tests and demos
	TypeGemini    = "gemini"    // Google's Gemini API (generateContent), for Chat Completions clients
	TypeAzure     = "azure"     // Azure OpenAI (deployments, api-version, api-key), for Chat Completions clients
	TypeBedrock   = "bedrock"   // Amazon Bedrock's Converse API (SigV4, the AWS credential chain), for Chat Completions clients
)

// DefaultAzureAPIVersion is the api-version an Azure OpenAI backend sends when api_version
// is unset: the GA data-plane version that followed 2024-09-01-preview, where streamed
// usage (stream_options.include_usage, which the gateway bills from) was added.
const DefaultAzureAPIVersion = "2024-10-21"

// The built-in mock backend present in [Default].
const (
	MockModel       = "oncegate-mock"
	MockBackendName = "mock"
)

// MockModelPrefix is the prefix every model served by a mock backend must
// carry: the mock never impersonates a real provider's model.
const MockModelPrefix = "oncegate-"

// CatchAll in a backend's models list makes it serve every model that no
// explicit route and no other backend serves by exact name.
const CatchAll = "*"

// Defaults that also apply to backend entries written in YAML.
const (
	DefaultBackendTimeout = 120 * time.Second
	DefaultMockTokens     = 16
)

// Config is oncegate's whole configuration.
type Config struct {
	Listen      string      `yaml:"listen"`    // HTTP listen address, host:port
	DataDir     string      `yaml:"data_dir"`  // the embedded NATS store, and an API node's cold tier index (also with nats.url)
	LogLevel    string      `yaml:"log_level"` // debug|info|warn|error
	Role        string      `yaml:"role"`      // all|api|worker
	NATS        NATS        `yaml:"nats"`
	HTTP        HTTP        `yaml:"http"`
	Workers     Workers     `yaml:"workers"`
	Idempotency Idempotency `yaml:"idempotency"`
	Admission   Admission   `yaml:"admission"`
	Backends    []Backend   `yaml:"backends"`
	Routes      []Route     `yaml:"routes"`
	Tenants     []Tenant    `yaml:"tenants"`
	Ledger      Ledger      `yaml:"ledger"`
	Admin       Admin       `yaml:"admin"`
	Tracing     Tracing     `yaml:"tracing"`
	Metrics     Metrics     `yaml:"metrics"`
	Dashboard   Dashboard   `yaml:"dashboard"`
}

// Dashboard configures the built-in dashboard (GET /dashboard). With tenants configured it
// needs an admin key (every tenant) or a tenant's key (that tenant's rows); without tenants it
// is served to loopback clients only, unless Public.
type Dashboard struct {
	Public bool `yaml:"public"` // --dashboard-public
}

// Tracing configures W3C trace propagation's optional span export. Propagation is always on:
// a client's traceparent reaches the backend, and every request's trace id is logged and kept
// in its record.
type Tracing struct {
	// OTLPEndpoint is an OTLP/HTTP collector's base URL (spans go to its /v1/traces); empty:
	// no spans are exported, at no cost.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// ServiceName is the exported service.name; empty: "oncegate".
	ServiceName string `yaml:"service_name"`
	// SampleRatio samples traces that start here (0 < r <= 1; 0: 1); a client's sampled flag
	// is followed either way.
	SampleRatio float64 `yaml:"sample_ratio"`
	// CaptureContent puts prompts and answers on the exported spans (the OpenTelemetry GenAI
	// attributes gen_ai.input.messages, gen_ai.system_instructions and gen_ai.output.messages,
	// text parts only). Off by default, as the conventions advise: spans then carry model
	// names, token counts and finish reasons, never content.
	CaptureContent bool `yaml:"capture_content"`
}

// SyncAuto is nats.sync's default: every write fsynced on one server ("always"), once a second
// on an embedded cluster node ("1s"), whose writes are on three servers' disks when acked.
// docs/operations/cluster.md gives the figures behind it (issue 44).
const SyncAuto = "auto"

// EffectiveSync is what nats.sync means for this configuration: "always" or a duration.
func (n NATS) EffectiveSync() string {
	if n.Sync != SyncAuto {
		return n.Sync
	}
	if n.Cluster.Enabled() {
		return "1s"
	}
	return "always"
}

// NATS configures the connection to NATS, or the embedded server.
type NATS struct {
	URL    string `yaml:"url"`    // empty = start the embedded server; else nats://... external
	Listen string `yaml:"listen"` // embedded server client listener; empty = no network port
	Sync   string `yaml:"sync"`   // "auto", "always" or a duration like "1s" (embedded only); auto: always on one server, 1s on a cluster node

	MaxPayload int32 `yaml:"max_payload"` // bytes
	// Replicas of every stream and bucket: 1, 3 or 5; 0 (the default) picks 1 on a single
	// server and 3 on a cluster of 3 or more. A start never lowers a count an operator raised.
	Replicas int `yaml:"replicas"`
	// Partitions splits every stream and bucket an intent touches into this many copies, each
	// with its own Raft leaders, a record key hashed to one of them (1 to 32; 0 or 1: one, the
	// unpartitioned layout). It is fixed when the streams are made: a start with another count
	// than the store's is refused.
	Partitions int `yaml:"partitions"`
	// PlacePartitions puts partition k's streams on the servers tagged og-p<k>
	// (nats.cluster.tags), so each partition is replicated on its own nodes; false lets
	// JetStream place them, spreading their leaders over the cluster.
	PlacePartitions bool `yaml:"place_partitions"`
	// Cluster joins the embedded server to the embedded servers of other oncegate nodes in
	// one JetStream cluster; empty = a single-node server.
	Cluster NATSCluster `yaml:"cluster"`
}

// NATSCluster configures the embedded server as one node of a JetStream cluster.
type NATSCluster struct {
	Name   string   `yaml:"name"`   // the cluster's name, the same on every node
	Listen string   `yaml:"listen"` // host:port for the other nodes' routes
	Routes []string `yaml:"routes"` // every node's route URL (nats://host:port), this one included
	// ServerName names this node in the cluster; empty = "<hostname>-<listen port>". It must
	// be unique and must not change: JetStream knows its peers by name.
	ServerName string `yaml:"server_name"`
	// Tags are this server's placement tags (e.g. og-p0 for a node of partition 0's servers,
	// nats.place_partitions).
	Tags []string `yaml:"tags"`
}

// Enabled says whether any cluster setting is given (Validate then requires all of them).
func (c NATSCluster) Enabled() bool {
	return c.Name != "" || c.Listen != "" || len(c.Routes) > 0 || c.ServerName != ""
}

// HTTP configures the HTTP server.
type HTTP struct {
	// MaxBodyBytes is the largest request body accepted: a larger one is answered 413
	// request_too_large (from its Content-Length, before a byte of it is read).
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// ReadTimeout bounds reading a request: a body not received within it is answered 408
	// request_timeout.
	ReadTimeout  Duration `yaml:"read_timeout"`
	WriteTimeout Duration `yaml:"write_timeout"` // not applied to SSE
	// IdleTimeout closes a keep-alive connection that stays idle this long.
	IdleTimeout   Duration `yaml:"idle_timeout"`
	ShutdownGrace Duration `yaml:"shutdown_grace"` // bounded wait for in-flight streams on SIGTERM
	// AccessLogSample is the share of requests whose access-log line (one per request, at
	// info) is written: 1 every one, 0 none; a 5xx is always written.
	AccessLogSample float64 `yaml:"access_log_sample"`
	// TLSCert and TLSKey are PEM files (--tls-cert, --tls-key; the key file may hold the key
	// alone, the certificate file the chain): with both, the HTTP API is served over TLS 1.2 or
	// later on Listen; with neither, plain HTTP. They are read once at start: restart a node
	// (rolling, with no intent lost) to rotate them. /metrics on metrics.listen stays plain.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"` // the PEM private key file of tls_cert (--tls-key)
}

// Workers configures the worker side.
type Workers struct {
	Concurrency int `yaml:"concurrency"` // concurrent backend calls per worker process
	// SweepEvery is how often a worker looks for PENDING records whose lease ran out with no
	// job left to redeliver (e.g. after a NATS restart) and re-drives them. Each sweep reads
	// the records written since the last one: at a few seconds they are still in the server's
	// block cache (kept 10 s), at a minute the sweep loads a minute of blocks back from disk.
	SweepEvery Duration `yaml:"sweep_every"`
	// ChargeGrace is how long after a finished record with something to charge was written a
	// worker's charge sweep makes sure it is in the ledger (charging it if its own worker did
	// not): a charge missing after a crash is written within charge_grace + sweep_every. Shorter
	// catches it sooner, and has the sweeps read records their workers are still charging.
	ChargeGrace Duration `yaml:"charge_grace"`
	// DiscardChunksAfter is how long a finished execution's chunks stay in the CHUNKS memory
	// stream after its terminal chunk (later copies answer from the record); 0 keeps them for
	// the stream's whole retention (15 min).
	DiscardChunksAfter Duration `yaml:"discard_chunks_after"`
	// ChunkLinger is the least time between two data chunks of one stream: tokens arriving
	// faster are coalesced, bounding the chunk message rate (and the writes to every SSE
	// client) at one per linger. The first chunk and the end never wait. 0 turns it off.
	ChunkLinger Duration `yaml:"chunk_linger"`
}

// Idempotency configures deduplication.
type Idempotency struct {
	// TTL is how long a key's record, and the result it holds, is kept: a copy within it is
	// replayed, after it the key is new.
	TTL Duration `yaml:"ttl"`
	// HotTTL is how long a key's record stays in the IDEM bucket (the hot tier); after it the
	// record is found in the cold tier (OG_COLD, indexed on each node's disk) until TTL. 0, or
	// TTL or more: no cold tier, every record stays hot for the whole TTL. A store that has
	// kept its keys hot so far stays so unless MoveExisting is set.
	HotTTL Duration `yaml:"hot_ttl"`
	// MoveExisting turns the cold tier on for a store that has kept every key hot (its IDEM
	// bucket keeps the TTL and it has no OG_COLD: made without a cold tier). Its records older
	// than HotTTL are copied first, and until they are, keys the hot tier does not hold are
	// answered 503 store_unavailable; turn it on at a quiet hour, on every node.
	MoveExisting bool `yaml:"move_existing"`
	// AutoWindow is how long identical requests without an Idempotency-Key are one intent,
	// measured from when each reached the gateway (a declared retry matches for the whole TTL).
	AutoWindow Duration `yaml:"auto_window"`
	// MaxWait is how long a non-stream copy of a running intent waits for its result before
	// it is answered 409 idempotency_key_in_use with Retry-After.
	MaxWait Duration `yaml:"max_wait"`
	// Lease is how long a PENDING record stays its worker's without a renewal; a record whose
	// lease ran out may be taken over (new epoch).
	Lease Duration `yaml:"lease"`
	// RenewEvery is how often a worker renews the lease of each execution it runs.
	RenewEvery Duration `yaml:"renew_every"`
	// RetryHeaders are extra header names whose presence (value != "" and
	// != "0") marks a request as a retry.
	RetryHeaders []string `yaml:"retry_headers"`
	// ReplayCacheBytes bounds the in-memory copy an API node keeps of replayed final records
	// (explicit keys only), so a repeated replay makes no JetStream round trip; 0 disables it.
	ReplayCacheBytes int64 `yaml:"replay_cache_bytes"`
}

// Admission bounds what an API node admits. Beyond a bound a new intent is answered 503 with
// Retry-After and x-should-retry at once, with nothing written; copies of existing intents
// (joins, replays) are always served.
type Admission struct {
	// MaxExecutions bounds the new executions this node admitted and has not answered yet
	// (a background job counts until it is submitted); 0: no bound.
	MaxExecutions int `yaml:"max_executions"`
	// MaxQueueWait bounds how long the job at the head of the JOBS queue (the next to reach
	// a worker, cluster-wide) may have waited; 0: no bound.
	MaxQueueWait Duration `yaml:"max_queue_wait"`
	// MaxBodyBytesInFlight bounds the request-body bytes of the new executions this node
	// admitted and has not answered; beyond it a new intent gets 503 like the other bounds
	// (0: no bound; at least http.max_body_bytes otherwise).
	MaxBodyBytesInFlight int64 `yaml:"max_body_bytes_in_flight"`
	// APINodes is how many API nodes share the tenants' limits (tenants[].limits): each
	// enforces the limit divided by it. Set it to the number of API processes (api or all
	// roles); more processes than it could exceed the limits together. Default 1 (0 is 1).
	APINodes int `yaml:"api_nodes"`
	// StoreWait is how long a new request waits for an unavailable store (a leader election, a
	// lost quorum) before it is refused with 503, when its client states no timeout of its own
	// (0: 10s).
	StoreWait Duration `yaml:"store_wait"`
	// StoreWaitMax bounds how long a client's stated timeout (the official SDKs'
	// X-Stainless-Timeout, x-stainless-read-timeout) makes a request wait for the store: the
	// stated timeout less a margin, at most this (0: store_wait, a stated timeout waits no
	// longer).
	StoreWaitMax Duration `yaml:"store_wait_max"`
}

// Backend is an upstream LLM API.
type Backend struct {
	Name      string    `yaml:"name"`        // unique; routes[].backends name backends by it
	Type      string    `yaml:"type"`        // TypeOpenAI | TypeAnthropic | TypeOncegate | TypeGemini | TypeAzure | TypeBedrock | TypeMock
	BaseURL   string    `yaml:"base_url"`    // the API's base URL, e.g. https://api.openai.com/v1; empty for a mock
	APIKeyEnv string    `yaml:"api_key_env"` // name of the env var holding the key (never the key itself); required for azure and gemini
	Models    []string  `yaml:"models"`      // CatchAll = models nobody else serves
	Timeout   Duration  `yaml:"timeout"`     // total time of one attempt
	Mock      MockKnobs `yaml:"mock"`        // only for TypeMock

	// ConnectTimeout bounds dialing (and TLS); a request never written is always safe to retry.
	ConnectTimeout Duration `yaml:"connect_timeout"`
	// FirstByteTimeout is how long a written request waits for the first response byte before
	// the gateway asks the backend what happened (type oncegate) or re-sends it (only with
	// honors_idempotency_key); otherwise it keeps waiting up to Timeout.
	FirstByteTimeout Duration `yaml:"first_byte_timeout"`
	// MaxAttempts bounds attempts on this backend (retries of safe failures, 429, 502-504).
	MaxAttempts int `yaml:"max_attempts"`
	// RetryBase and RetryCap shape exponential backoff with full jitter.
	RetryBase Duration `yaml:"retry_base"`
	RetryCap  Duration `yaml:"retry_cap"` // the longest backoff between two attempts
	// RetryBudget is the largest fraction of requests that may be retries (sliding window).
	RetryBudget float64 `yaml:"retry_budget"`
	// HonorsIdempotencyKey: the backend deduplicates a forwarded Idempotency-Key, so a
	// written request may be re-sent after a first-byte timeout.
	HonorsIdempotencyKey bool `yaml:"honors_idempotency_key"`
	// Continuation continues a broken stream: "" (never), "vllm" (continue_final_message),
	// "anthropic" (assistant prefill, on PrefillModels only).
	Continuation  string   `yaml:"continuation"`
	PrefillModels []string `yaml:"prefill_models"` // the models continued by prefill (continuation: anthropic)
	// AnthropicVersion is sent as anthropic-version when the client sent none.
	AnthropicVersion string `yaml:"anthropic_version"`
	// Responses is how POST /v1/responses reaches this backend: "" translates it to Chat
	// Completions (or Messages), "native" sends it as it is (an OpenAI-compatible backend
	// that serves /v1/responses itself).
	Responses string  `yaml:"responses"`
	Breaker   Breaker `yaml:"breaker"`
	// Deployments maps a model to its Azure OpenAI deployment name (type azure only); a model
	// it does not list is sent to the deployment of its own name.
	Deployments map[string]string `yaml:"deployments"`
	// APIVersion is the api-version query parameter of an Azure OpenAI backend (type azure):
	// a dated version, YYYY-MM-DD or YYYY-MM-DD-preview, 2024-09-01 or later.
	APIVersion string `yaml:"api_version"`
	// Region is the AWS region a Bedrock backend (type bedrock) signs its requests for; empty:
	// the region of base_url's host (bedrock-runtime.{region}.amazonaws.com).
	Region string `yaml:"region"`
	// ModelIDs maps a model to its Bedrock model id or inference profile (type bedrock only,
	// e.g. anthropic.claude-3-5-haiku-20241022-v1:0); a model it does not list is sent as the
	// id of its own name.
	ModelIDs map[string]string `yaml:"model_ids"`
	// Passthrough lists other paths this backend serves as they are.
	Passthrough []Passthrough `yaml:"passthrough"`
}

// Breaker configures a backend's circuit breaker.
type Breaker struct {
	// FailureRate opens the breaker when failures/requests reach it over Window, once at
	// least MinRequests were seen.
	FailureRate float64  `yaml:"failure_rate"`
	Window      Duration `yaml:"window"`       // the sliding window failure_rate is measured over
	MinRequests int      `yaml:"min_requests"` // requests seen in the window before the breaker may open
	// OpenFor is how long it stays open before half-open probes decide.
	OpenFor Duration `yaml:"open_for"`
	// Probes is how many requests a half-open breaker lets through.
	Probes int `yaml:"probes"`
}

// ResponsesNative is the Responses mode of a backend that serves the Responses API itself.
const ResponsesNative = "native"

// Continuation modes.
const (
	ContinuationVLLM      = "vllm"
	ContinuationAnthropic = "anthropic"
)

// BackendDefaults are the values a backend entry starts from.
func BackendDefaults() Backend {
	return Backend{
		Timeout:          Duration(DefaultBackendTimeout),
		Mock:             MockKnobs{Tokens: DefaultMockTokens},
		ConnectTimeout:   Duration(800 * time.Millisecond),
		FirstByteTimeout: Duration(8 * time.Second),
		MaxAttempts:      3,
		RetryBase:        Duration(250 * time.Millisecond),
		RetryCap:         Duration(8 * time.Second),
		RetryBudget:      0.2,
		AnthropicVersion: "2023-06-01",
		APIVersion:       DefaultAzureAPIVersion,
		Breaker: Breaker{FailureRate: 0.5, Window: Duration(30 * time.Second), MinRequests: 10,
			OpenFor: Duration(15 * time.Second), Probes: 1},
	}
}

// WithDefaults fills every zero resilience setting with its default.
func (b Backend) WithDefaults() Backend {
	d := BackendDefaults()
	fill := func(v *Duration, def Duration) {
		if *v == 0 {
			*v = def
		}
	}
	fill(&b.Timeout, d.Timeout)
	fill(&b.ConnectTimeout, d.ConnectTimeout)
	fill(&b.FirstByteTimeout, d.FirstByteTimeout)
	fill(&b.RetryBase, d.RetryBase)
	fill(&b.RetryCap, d.RetryCap)
	fill(&b.Breaker.Window, d.Breaker.Window)
	fill(&b.Breaker.OpenFor, d.Breaker.OpenFor)
	if b.MaxAttempts == 0 {
		b.MaxAttempts = d.MaxAttempts
	}
	if b.RetryBudget == 0 {
		b.RetryBudget = d.RetryBudget
	}
	if b.AnthropicVersion == "" {
		b.AnthropicVersion = d.AnthropicVersion
	}
	if b.APIVersion == "" {
		b.APIVersion = d.APIVersion
	}
	if b.Breaker.FailureRate == 0 {
		b.Breaker.FailureRate = d.Breaker.FailureRate
	}
	if b.Breaker.MinRequests == 0 {
		b.Breaker.MinRequests = d.Breaker.MinRequests
	}
	if b.Breaker.Probes == 0 {
		b.Breaker.Probes = d.Breaker.Probes
	}
	return b
}

// Degraded is what a route answers when none of its backends is healthy.
type Degraded struct {
	// Message, when set, is answered as a normal assistant message (status 200, header
	// Oncegate-Degraded: true); otherwise the route answers 503 with Retry-After.
	Message string `yaml:"message"`
	// RetryAfter is the Retry-After of the 503 when there is no Message (rounded up to
	// whole seconds; 0: 1 s).
	RetryAfter Duration `yaml:"retry_after"`
}

// MockKnobs tunes the mock backend.
type MockKnobs struct {
	TTFT       Duration `yaml:"ttft"`        // delay before the first token
	InterToken Duration `yaml:"inter_token"` // delay between tokens
	Tokens     int      `yaml:"tokens"`      // tokens per completion
}

// Route is an explicit route for one model; it overrides the backends' models
// lists.
type Route struct {
	Model    string    `yaml:"model"`    // the model name requests ask for; one route per model
	Backends []string  `yaml:"backends"` // ordered: the next is tried when one is down
	Dedup    *bool     `yaml:"dedup"`    // nil = true; false = every request executes
	Degraded *Degraded `yaml:"degraded"` // nil = 503 with Retry-After when all backends are down
}

// Tenant is a client of the gateway, authenticated by API key.
type Tenant struct {
	ID            string   `yaml:"id"`              // unique, [A-Za-z0-9_.-]+
	APIKeysSHA256 []string `yaml:"api_keys_sha256"` // hex sha256 of each API key
	Budget        *Budget  `yaml:"budget"`          // nil = no spend limit
	Limits        Limits   `yaml:"limits"`          // caps across every API node; zero = none
}

// Limits are a tenant's caps, for the whole deployment: each API node enforces its share,
// the cap divided by admission.api_nodes (Share), so the nodes together never exceed it.
// Beyond a cap a request gets 429 with Retry-After; 0 is no cap.
type Limits struct {
	// Executions caps the tenant's new executions running at once (copies never count).
	Executions int `yaml:"executions"`
	// Streams caps the tenant's streamed answers being delivered at once (new and joined).
	Streams int `yaml:"streams"`
	// FollowersPerJob caps the copies following one execution at once.
	FollowersPerJob int `yaml:"followers_per_job"`
	// RequestsPerSecond is a token bucket over every model request (copies included) that
	// holds Burst requests (0: the rate rounded up).
	RequestsPerSecond float64 `yaml:"requests_per_second"`
	Burst             int     `yaml:"burst"` // the bucket size of requests_per_second (0: the rate rounded up)
	// TokensPerMinute is a token bucket over what new executions may use: their estimated
	// input (4 bytes a token) and max_tokens (or ledger.default_max_tokens), counted at
	// admission as the providers count it.
	TokensPerMinute int `yaml:"tokens_per_minute"`
}

// Share is one node's part of l when nodes API nodes share it: every cap divided by nodes,
// rounded down (Validate makes each at least 1).
func (l Limits) Share(nodes int) Limits {
	if nodes <= 1 {
		return l
	}
	l.Executions /= nodes
	l.Streams /= nodes
	l.FollowersPerJob /= nodes
	if l.RequestsPerSecond > 0 {
		l.Burst = l.burst() / nodes
	}
	l.RequestsPerSecond /= float64(nodes)
	l.TokensPerMinute /= nodes
	return l
}

// burst is the bucket size of RequestsPerSecond: Burst, or the rate rounded up.
func (l Limits) burst() int {
	if l.Burst > 0 {
		return l.Burst
	}
	return int(math.Ceil(l.RequestsPerSecond))
}

// Budget is a tenant's spend limit per period, in micro-units of the ledger's currency.
type Budget struct {
	Limit  int64  `yaml:"limit"`  // the most net spend per period, in micro-units
	Period string `yaml:"period"` // day | month
}

// Ledger configures billing: the price table and the reconciler.
type Ledger struct {
	Currency string `yaml:"currency"` // a 3-letter upper-case currency code, named on bills
	// Prices per model, in micro-units per million tokens.
	Prices map[string]Price `yaml:"prices"`
	// ReconcileEvery is how often a worker process runs the reconciler.
	ReconcileEvery Duration `yaml:"reconcile_every"`
	// DefaultMaxTokens estimates the output of a request that sets no max_tokens: for
	// tokens_per_minute, and for a budget until the node has seen 8 answers of the model
	// (then the most its last 256 answers returned).
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// TallyEvery is how often an API process flushes its count of executions avoided (joins
	// and replays) to OG_TALLY, for the bills; a crash loses at most one interval's counts.
	TallyEvery Duration `yaml:"tally_every"`
	// Secret keys the ledger's hash chain (HMAC-SHA-256) and signs the heads `oncegate ledger
	// head` exports: nobody without it can recompute the chain after an edit. At least 32
	// bytes; empty = unkeyed (SHA-256). Overridden by ONCEGATE_LEDGER_SECRET. Once set, keep it
	// (`ledger verify` reports unkeyed entries after keyed ones), or rotate it (RetiredSecrets).
	Secret string `yaml:"secret,omitempty"`
	// RetiredSecrets are the secrets Secret replaced, oldest first, for `ledger verify`: each
	// verifies what was signed with it up to its until, nothing after. Rotating: set the new
	// secret, move the old one here with until a time after the last node stopped writing with
	// it, restart the nodes.
	RetiredSecrets []RetiredSecret `yaml:"retired_secrets,omitempty"`
}

// RetiredSecret is a ledger secret no longer used for new entries, and when it stopped being.
type RetiredSecret struct {
	Secret string    `yaml:"secret"` // the retired secret
	Until  Timestamp `yaml:"until"`  // verify accepts it for entries dated up to this time: a time after the last node stopped writing with it
}

// Timestamp is a time written in RFC 3339 (2026-12-04T20:00:00Z).
type Timestamp struct{ time.Time }

// MarshalYAML encodes t in RFC 3339.
func (t Timestamp) MarshalYAML() (any, error) { return t.Format(time.RFC3339Nano), nil }

// UnmarshalYAML decodes an RFC 3339 time.
func (t *Timestamp) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		if v, err := time.Parse(time.RFC3339Nano, n.Value); err == nil {
			t.Time = v
			return nil
		}
	}
	return &yaml.TypeError{Errors: []string{fmt.Sprintf(
		"line %d: cannot unmarshal %s into a time (want RFC 3339, like \"2026-12-04T20:00:00Z\")", n.Line, describeNode(n))}}
}

// MinLedgerSecret is the shortest ledger.secret accepted, in bytes (ledger.MinSecretLen).
const MinLedgerSecret = 32

// Price is a model's price per million tokens, in micro-units.
type Price struct {
	InputPerMillion  int64 `yaml:"input_per_million"`  // micro-units per million input tokens
	OutputPerMillion int64 `yaml:"output_per_million"` // micro-units per million output tokens
}

// Metrics configures the Prometheus endpoint. /metrics is always served on the API listener
// (open when no tenants are configured, else behind an admin key: it names tenants and their
// spend); Listen adds a separate, unauthenticated listener for any role, so a worker-only
// process can be scraped and the scrape port can be kept off the public interface.
type Metrics struct {
	Listen string `yaml:"listen"` // host:port; empty = no separate listener
}

// Admin configures the admin API (/v1/admin/…).
type Admin struct {
	APIKeysSHA256 []string `yaml:"api_keys_sha256"` // empty = the admin API is off
}

// backend has Backend's fields but no methods; it lets Backend.UnmarshalYAML
// decode with the default decoder (and its KnownFields setting) without
// recursing.
type backend Backend

// UnmarshalYAML decodes a backend entry, starting from the backend defaults
// (timeout 120s, mock tokens 16) so that omitted fields are not zero.
//
// A value of the wrong type inside the entry leaves that field at its default
// and is not returned: yaml.v3 drops a list element whose Unmarshaler fails,
// and validation would then report a missing backend that the file has. The
// walk in check.go, which every load goes through, reports those values with
// their paths and lines.
func (b *Backend) UnmarshalYAML(unmarshal func(any) error) error {
	v := backend{
		Timeout: Duration(DefaultBackendTimeout),
		Mock:    MockKnobs{Tokens: DefaultMockTokens},
	}
	var te *yaml.TypeError
	if err := unmarshal(&v); err != nil && !errors.As(err, &te) {
		return err
	}
	*b = Backend(v)
	return nil
}

// Duration is a time.Duration that YAML (un)marshals from/to Go duration
// strings such as "3s" or "150ms".
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String returns the Go duration string, e.g. "1m30s".
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML encodes d as a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML decodes a Go duration string. A bare 0 is accepted too.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		if v, err := time.ParseDuration(n.Value); err == nil {
			*d = Duration(v)
			return nil
		}
	}
	// A *yaml.TypeError lets the decoder carry on and report every bad value,
	// each with its line, like its own type errors.
	return &yaml.TypeError{Errors: []string{fmt.Sprintf(
		"line %d: cannot unmarshal %s into a duration (want a Go duration string like \"3s\" or \"150ms\")",
		n.Line, describeNode(n))}}
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return fmt.Sprintf("%s `%s`", n.ShortTag(), truncate(n.Value, 40))
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a value"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Default returns the default configuration. It is valid, and its only
// backend is the built-in mock serving [MockModel].
func Default() *Config {
	return &Config{
		Listen:   "127.0.0.1:8080",
		DataDir:  "./data",
		LogLevel: "info",
		Role:     "all",
		NATS: NATS{
			Sync:       SyncAuto,
			MaxPayload: 8 << 20,
		},
		HTTP: HTTP{
			AccessLogSample: 1,
			MaxBodyBytes:    4 << 20,
			ReadTimeout:     Duration(30 * time.Second),
			WriteTimeout:    Duration(30 * time.Second),
			IdleTimeout:     Duration(120 * time.Second),
			ShutdownGrace:   Duration(10 * time.Second),
		},
		Workers: Workers{Concurrency: 256, SweepEvery: Duration(5 * time.Second), ChargeGrace: Duration(30 * time.Second), DiscardChunksAfter: Duration(10 * time.Second)},
		Idempotency: Idempotency{
			TTL:        Duration(24 * time.Hour),
			HotTTL:     Duration(15 * time.Minute),
			AutoWindow: Duration(3 * time.Second),
			MaxWait:    Duration(30 * time.Second),
			Lease:      Duration(15 * time.Second),
			RenewEvery: Duration(3 * time.Second),
			// 32 MiB
			ReplayCacheBytes: 32 << 20,
		},
		Admission: Admission{MaxExecutions: 1024, MaxQueueWait: Duration(30 * time.Second), MaxBodyBytesInFlight: 256 << 20, APINodes: 1,
			StoreWait: Duration(10 * time.Second), StoreWaitMax: Duration(time.Minute)},
		Backends: []Backend{defaultMock()},
		Ledger:   Ledger{Currency: "USD", ReconcileEvery: Duration(time.Minute), DefaultMaxTokens: 1024, TallyEvery: Duration(10 * time.Second)},
	}
}

// Load reads the configuration: with path "" it starts from [Default],
// otherwise it decodes the YAML file over [Default] (unknown keys are
// errors). It then applies the environment ([Config.ApplyEnv] with os.Getenv)
// and validates.
//
// With a file, every problem is returned at once as a [*FileError]: syntax,
// unknown fields, wrong types and validation, each with its YAML path and
// line. Without one, a validation failure is a [*ValidationError]. Both match
// [ErrInvalid].
func Load(path string) (*Config, error) {
	return LoadWith(path, os.Getenv)
}

// LoadWith is [Load] with the environment read through getenv. An incomplete environment
// (OPENAI_BASE_URL without OPENAI_API_KEY) is an [ErrEnvIncomplete] error.
func LoadWith(path string, getenv func(string) string) (*Config, error) {
	var c *Config
	if path == "" {
		c = Default()
		c.ApplyEnv(getenv)
		if err := c.Validate(); err != nil {
			return nil, err
		}
	} else {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if c, err = check(path, data, func(c *Config) { c.ApplyEnv(getenv) }); err != nil {
			return nil, err
		}
	}
	if err := c.checkEnv(getenv); err != nil {
		return nil, err
	}
	return c, nil
}

// Parse decodes YAML over [Default] and validates the result, exactly like
// [Load] but from bytes and without applying the environment. Problems are
// returned as a [*FileError] without a file name.
func Parse(data []byte) (*Config, error) {
	return check("", data, func(*Config) {})
}

// RouteTarget is where requests for a model go.
type RouteTarget struct {
	Model    string
	Backends []string // ordered fallback chain
	Dedup    bool
	Degraded *Degraded
}

func defaultMock() Backend {
	return Backend{Name: MockBackendName, Type: TypeMock, Models: []string{MockModel},
		Timeout: Duration(DefaultBackendTimeout), Mock: MockKnobs{Tokens: DefaultMockTokens}}
}

// Resolve returns the route for a model: an explicit route for the exact
// model wins; else the first backend whose models list contains the exact
// model; else the first backend whose models list contains [CatchAll].
// Dedup is true unless an explicit route disables it. ok is false for an
// unknown model.
func (c *Config) Resolve(model string) (RouteTarget, bool) {
	if model == "" {
		return RouteTarget{}, false
	}
	for _, r := range c.Routes {
		if r.Model == model {
			return RouteTarget{
				Model:    model,
				Backends: slices.Clone(r.Backends),
				Dedup:    r.Dedup == nil || *r.Dedup,
				Degraded: r.Degraded,
			}, true
		}
	}
	for _, b := range c.Backends {
		if slices.Contains(b.Models, model) {
			return RouteTarget{Model: model, Backends: []string{b.Name}, Dedup: true}, true
		}
	}
	for _, b := range c.Backends {
		if slices.Contains(b.Models, CatchAll) {
			return RouteTarget{Model: model, Backends: []string{b.Name}, Dedup: true}, true
		}
	}
	return RouteTarget{}, false
}

// IsHTTPType reports whether t is a backend type served over HTTP: every known type but the
// mock. Validation and the backend client both ask it, so a type is added in one place.
func IsHTTPType(t string) bool {
	switch t {
	case TypeOpenAI, TypeAnthropic, TypeOncegate, TypeGemini, TypeAzure, TypeBedrock:
		return true
	}
	return false
}

// ModelNames returns every exact (non-[CatchAll]) model name served by a
// backend or an explicit route, sorted and deduplicated.
func (c *Config) ModelNames() []string {
	var names []string
	for _, b := range c.Backends {
		for _, m := range b.Models {
			if m != CatchAll && m != "" {
				names = append(names, m)
			}
		}
	}
	for _, r := range c.Routes {
		if r.Model != CatchAll && r.Model != "" {
			names = append(names, r.Model)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// IsHeaderName reports whether s is a valid HTTP header field name (an RFC 9110 token), the
// rule idempotency.retry_headers follows; `oncegate bench --header` checks names with it too.
func IsHeaderName(s string) bool { return isToken(s) }

// Backend returns the backend with the given name.
func (c *Config) Backend(name string) (Backend, bool) {
	for _, b := range c.Backends {
		if b.Name == name {
			return b, true
		}
	}
	return Backend{}, false
}

// ColdTier reports whether records move from the hot IDEM bucket to the cold tier: a hot TTL
// set below the TTL.
func (i Idempotency) ColdTier() bool { return i.HotTTL > 0 && i.HotTTL < i.TTL }

// Hot is how long a record stays in the IDEM bucket: the hot TTL with a cold tier, else TTL.
func (i Idempotency) Hot() time.Duration {
	if i.ColdTier() {
		return i.HotTTL.D()
	}
	return i.TTL.D()
}
