// Package backend holds the provider adapters that workers call: an OpenAI-compatible HTTP
// client (OpenAI, vLLM, TGI, DeepSeek…) and the built-in deterministic mock, which is the same
// client over an in-memory transport. A Client is safe for concurrent use.
package backend

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
)

// Client calls one OpenAI-compatible backend.
type Client struct {
	name    string
	baseURL string
	apiKey  string
	timeout time.Duration
	http    *http.Client
	mock    *mockllm.Server
}

// New builds the client for a configured backend; getenv resolves api_key_env.
func New(b config.Backend, getenv func(string) string) (*Client, error) {
	c := &Client{name: b.Name, timeout: b.Timeout.D()}
	switch b.Type {
	case config.TypeMock:
		c.mock = mockllm.New(mockllm.Options{TTFT: b.Mock.TTFT.D(), InterToken: b.Mock.InterToken.D(), Tokens: b.Mock.Tokens, Models: b.Models})
		c.baseURL = "http://mock.internal/v1"
		c.http = &http.Client{Transport: c.mock.RoundTripper()}
	case config.TypeOpenAI:
		c.baseURL = strings.TrimRight(b.BaseURL, "/")
		if b.APIKeyEnv != "" {
			c.apiKey = getenv(b.APIKeyEnv)
		}
		c.http = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 800 * time.Millisecond, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout: 5 * time.Second,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   true,
		}}
	default:
		return nil, fmt.Errorf("backend %s: unknown type %q", b.Name, b.Type)
	}
	return c, nil
}

// Name is the configured backend name.
func (c *Client) Name() string { return c.name }

// Mock is the in-process mock server behind a mock backend (nil for real providers).
func (c *Client) Mock() *mockllm.Server { return c.mock }

// ChatCompletions sends one chat completion request. The caller closes the response body and
// owns ctx: the client applies its total timeout on top of it. For a streamed request it asks
// the backend for usage (stream_options.include_usage), which the gateway needs for billing;
// the body's stream field is set to the execution's mode.
func (c *Client) ChatCompletions(ctx context.Context, body []byte, stream bool) (*http.Response, context.CancelFunc, error) {
	body, err := PrepareBody(body, stream)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("backend %s: build request: %w", c.name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("backend %s: %w", c.name, err)
	}
	return resp, cancel, nil
}

// PrepareBody sets the request's transport fields for the execution mode: "stream" as given,
// and for a stream stream_options.include_usage (the gateway bills from usage); a non-stream
// request carries no stream_options (vLLM rejects them). Other fields are kept as sent; the
// body is returned unchanged when it already fits.
func PrepareBody(body []byte, stream bool) ([]byte, error) {
	var probe struct {
		Stream        *bool                      `json:"stream"`
		StreamOptions map[string]json.RawMessage `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		return nil, fmt.Errorf("backend: request body: %w", err)
	}
	streamOK := (probe.Stream != nil && *probe.Stream == stream) || (probe.Stream == nil && !stream)
	usageOK := (stream && string(probe.StreamOptions["include_usage"]) == "true") || (!stream && probe.StreamOptions == nil)
	if streamOK && usageOK {
		return body, nil
	}
	var full map[string]json.RawMessage
	if err := json.Unmarshal(body, &full); err != nil {
		return nil, fmt.Errorf("backend: request body: %w", err)
	}
	if stream {
		full["stream"] = json.RawMessage("true")
		so := probe.StreamOptions
		if so == nil {
			so = map[string]json.RawMessage{}
		}
		so["include_usage"] = json.RawMessage("true")
		full["stream_options"], _ = json.Marshal(so)
	} else {
		delete(full, "stream")
		delete(full, "stream_options")
	}
	return json.Marshal(full)
}
