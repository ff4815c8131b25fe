// Package azure is the dialect of Azure OpenAI's Chat Completions for Chat Completions
// clients. The wire is OpenAI's, so the request body, the stream's chunks, the usage chunk
// (stream_options.include_usage), a non-stream answer and what is said without a backend
// are the openai dialect's; what differs is where a request goes and how a failure reads:
//
//   - the path names the deployment and the api-version:
//     /openai/deployments/{deployment}/chat/completions?api-version={version}, below the
//     resource endpoint (https://{resource}.openai.azure.com), the deployment from the
//     backend's deployments (else the model's name) and the version from its api_version;
//   - the key goes in the api-key header, not Authorization;
//   - Azure opens a stream with a chunk of its own, no choices and no usage, only
//     prompt_filter_results: it is an opening event (a break before the first token is still
//     sent again) and is not relayed, so a client sees the chunks an OpenAI stream has;
//   - an Azure error body ({"error": {"code", "message", "param", "innererror"…}}, or an
//     API gateway's {"statusCode", "message"}) becomes an OpenAI one, the content-filter
//     details (innererror) kept.
//
// Azure OpenAI has no way to continue a given answer (no continue_final_message, and an
// assistant message last is answered, not continued): a broken stream is never continued.
//
// A Stream is not safe for concurrent use; the rest is.
package azure

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/openai"
	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/openaiwire"
)

// BackendType is the configured type of an Azure OpenAI backend.
const BackendType = config.TypeAzure

// KeyHeader is the header an Azure OpenAI key goes in.
const KeyHeader = "api-key"

// Dialect is the Azure OpenAI dialect: the openai dialect with Azure's path, key header and
// error body.
type Dialect struct{ openai.Dialect }

// New returns the dialect.
func New() Dialect { return Dialect{} }

// Name implements dialect.Dialect.
func (Dialect) Name() string { return "azure" }

// BackendType implements dialect.Dialect.
func (Dialect) BackendType() string { return BackendType }

// Path is the chat completions path of model on backend b, with its api-version query.
func Path(b config.Backend, model string) string {
	return "/openai/deployments/" + url.PathEscape(b.Deployment(model)) + "/chat/completions?api-version=" + url.QueryEscape(b.AzureAPIVersion())
}

// Prepare is the openai dialect's request (the body with the execution's stream fields) sent
// to the model's deployment with the key in api-key.
func (d Dialect) Prepare(req dialect.Request, b config.Backend) (dialect.Upstream, error) {
	up, err := d.Dialect.Prepare(req, b)
	if err != nil {
		return dialect.Upstream{}, err
	}
	up.Path, up.KeyHeader = Path(b, req.Model), KeyHeader
	return up, nil
}

// azureError is what is read of an Azure error body: Azure's own error object, or the
// {"statusCode", "message"} of the API gateway in front of it.
type azureError struct {
	Error *struct {
		Code       json.RawMessage `json:"code"` // a string ("content_filter", "429"), sometimes a number
		Message    string          `json:"message"`
		Type       string          `json:"type"`
		Param      string          `json:"param"`
		InnerError json.RawMessage `json:"innererror"`
	} `json:"error"`
	StatusCode int    `json:"statusCode"`
	Message    string `json:"message"`
}

// openAIError is the OpenAI error object, with Azure's innererror (content-filter results)
// kept when there is one.
type openAIError struct {
	Message    string          `json:"message"`
	Type       string          `json:"type"`
	Param      *string         `json:"param"`
	Code       *string         `json:"code"`
	InnerError json.RawMessage `json:"innererror,omitempty"`
}

// ErrorBody turns an Azure error body into an OpenAI one: the message, param and code kept
// (a numeric code as its text), the type Azure gave or else the HTTP status's, innererror
// kept. A body that is not Azure's says the status.
func (Dialect) ErrorBody(status int, body []byte) []byte {
	out := openAIError{Message: fmt.Sprintf("the azure backend failed with status %d", status), Type: openaiwire.ErrorType(status)}
	var e azureError
	if json.Unmarshal(body, &e) == nil {
		switch {
		case e.Error != nil:
			if e.Error.Message != "" {
				out.Message = e.Error.Message
			}
			if e.Error.Type != "" {
				out.Type = e.Error.Type
			}
			if e.Error.Param != "" {
				out.Param = &e.Error.Param
			}
			if c := codeText(e.Error.Code); c != "" {
				out.Code = &c
			}
			if len(e.Error.InnerError) > 0 && string(e.Error.InnerError) != "null" {
				out.InnerError = e.Error.InnerError
			}
		case e.Message != "":
			out.Message = e.Message
			if e.StatusCode != 0 {
				c := strconv.Itoa(e.StatusCode)
				out.Code = &c
			}
		}
	}
	b, _ := json.Marshal(struct {
		Error openAIError `json:"error"`
	}{out})
	return b
}

// codeText is an error code as text: a string as it is, a number as its digits.
func codeText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// NewStream implements dialect.Dialect: an OpenAI stream, never continued (so its text is
// not kept).
func (Dialect) NewStream(dialect.StreamOptions) dialect.Stream {
	return &Stream{Stream: &openai.Stream{}}
}

// Stream decodes an Azure OpenAI stream: the openai dialect's, without Azure's
// prompt-filter chunk, never continued.
type Stream struct {
	*openai.Stream
}

// Opening: the role-only chunk, and Azure's prompt-filter chunk before it.
func (s *Stream) Opening(ev dialect.Event) bool {
	return promptFilter(ev.Data) || s.Stream.Opening(ev)
}

// Decode drops the prompt-filter chunk and relays the rest as the openai dialect does.
func (s *Stream) Decode(ev dialect.Event, c *dialect.Continued) dialect.Out {
	if promptFilter(ev.Data) {
		return dialect.Out{}
	}
	return s.Stream.Decode(ev, c)
}

// promptFilter reports whether data is Azure's chunk of prompt_filter_results: no choices,
// no usage.
func promptFilter(data []byte) bool {
	if !bytes.Contains(data, []byte(`"prompt_filter_results"`)) {
		return false
	}
	var c struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   json.RawMessage   `json:"usage"`
		Filter  json.RawMessage   `json:"prompt_filter_results"`
	}
	if json.Unmarshal(data, &c) != nil {
		return false
	}
	return len(c.Choices) == 0 && (len(c.Usage) == 0 || string(c.Usage) == "null") && len(c.Filter) > 0
}

// CanContinue implements dialect.Stream: Azure OpenAI cannot continue a given answer.
func (s *Stream) CanContinue(config.Backend) bool { return false }

// Continuation implements dialect.Stream; it is never called (CanContinue is false).
func (s *Stream) Continuation([]byte) ([]byte, error) {
	return nil, errors.New("azure: a stream is not continued")
}
