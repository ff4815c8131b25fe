// Package openaiwire reads and writes the OpenAI Chat Completions wire format: the SSE event
// stream of a backend, the usage-only chunk, and the two conversions that let a streamed and a
// non-streamed copy of one intent share one execution (assembling a chat.completion from
// chunks, and synthesizing chunks from a chat.completion). It also builds OpenAI error bodies.
// All functions are pure and safe for concurrent use.
package openaiwire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/oncegate/oncegate/internal/jsonscan"
)

// ErrTruncated is returned when an event stream ends without `data: [DONE]`.
var ErrTruncated = errors.New("openaiwire: stream ended without [DONE]")

// ErrMalformed is returned for input that is not the expected JSON shape.
var ErrMalformed = errors.New("openaiwire: malformed")

// MaxEventBytes bounds one SSE event read from a backend.
const MaxEventBytes = 4 << 20

var doneData = []byte("[DONE]")

// EventReader reads SSE events from a backend response one at a time.
type EventReader struct {
	br    *bufio.Reader
	data  []byte
	line  []byte
	event []byte
}

// NewEventReader reads events from r.
func NewEventReader(r io.Reader) *EventReader {
	return &EventReader{br: bufio.NewReaderSize(r, 32<<10)}
}

// Buffered reports whether more input is already read and waiting: a writer can coalesce
// events while this is true without adding latency.
func (er *EventReader) Buffered() bool { return er.br.Buffered() > 0 }

// Next returns the data of the next event (valid until the next call). It returns io.EOF
// after `[DONE]`, ErrTruncated if the input ends first, or the read error. Comments, event
// names and ids are ignored; multi-line data is joined with "\n" as the SSE spec says.
func (er *EventReader) Next() ([]byte, error) {
	_, data, err := er.NextEvent()
	return data, err
}

// NextEvent is Next with the event's name ("" when the event has no `event:` field), for
// protocols that name their events (Anthropic).
func (er *EventReader) NextEvent() (string, []byte, error) {
	er.data, er.event = er.data[:0], er.event[:0]
	have := false
	for {
		line, err := er.readLine()
		if err != nil {
			if err == io.EOF {
				if have && bytes.Equal(er.data, doneData) {
					return "", nil, io.EOF
				}
				return "", nil, ErrTruncated
			}
			return "", nil, fmt.Errorf("openaiwire: read events: %w", err)
		}
		if len(line) == 0 {
			if !have {
				continue
			}
			if bytes.Equal(er.data, doneData) {
				return "", nil, io.EOF
			}
			return string(er.event), er.data, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		if string(field) == "event" {
			er.event = append(er.event[:0], value...)
			continue
		}
		if string(field) == "data" {
			if have {
				er.data = append(er.data, '\n')
			}
			er.data = append(er.data, value...)
			have = true
			if len(er.data) > MaxEventBytes {
				return "", nil, fmt.Errorf("%w: event over %d bytes", ErrMalformed, MaxEventBytes)
			}
		}
	}
}

// readLine returns one line without its line ending; a final line without one is returned
// before io.EOF.
func (er *EventReader) readLine() ([]byte, error) {
	er.line = er.line[:0]
	for {
		frag, err := er.br.ReadSlice('\n')
		er.line = append(er.line, frag...)
		if err == bufio.ErrBufferFull {
			if len(er.line) > MaxEventBytes {
				return nil, fmt.Errorf("%w: line over %d bytes", ErrMalformed, MaxEventBytes)
			}
			continue
		}
		if err == io.EOF && len(er.line) > 0 {
			return bytes.TrimRight(er.line, "\r\n"), nil
		}
		if err != nil {
			return nil, err
		}
		return bytes.TrimRight(er.line, "\r\n"), nil
	}
}

// ReadEvents calls fn with the data of each SSE event until `[DONE]`. It returns nil after
// [DONE], ErrTruncated if the stream ends first, or the read error.
func ReadEvents(r io.Reader, fn func(data []byte) error) error {
	er := NewEventReader(r)
	for {
		data, err := er.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(data); err != nil {
			return err
		}
	}
}

// Frame returns data as one SSE frame: "data: <data>\n\n".
func Frame(data []byte) []byte {
	out := make([]byte, 0, len(data)+8)
	return AppendFrame(out, data)
}

// AppendFrame appends data as one SSE frame to dst.
func AppendFrame(dst, data []byte) []byte {
	dst = append(dst, "data: "...)
	dst = append(dst, data...)
	return append(dst, '\n', '\n')
}

// DoneFrame ends an OpenAI stream.
var DoneFrame = []byte("data: [DONE]\n\n")

// Usage is token usage.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type usageProbe struct {
	Choices []json.RawMessage `json:"choices"`
	Usage   *Usage            `json:"usage"`
}

// UsageOnly reports whether a chunk is the usage-only chunk (`choices: []` with usage) and
// returns its usage. Cheap for ordinary chunks: they are not decoded.
func UsageOnly(data []byte) (*Usage, bool) {
	if !bytes.Contains(data, []byte(`"usage":{`)) && !bytes.Contains(data, []byte(`"usage": {`)) {
		return nil, false
	}
	var p usageProbe
	if err := json.Unmarshal(data, &p); err != nil || p.Usage == nil || len(p.Choices) != 0 {
		return nil, false
	}
	return p.Usage, true
}

// UsageOf reads the usage of a chat.completion body, if any: what json.Unmarshal of the body
// into {choices, usage} gives (nil where that fails), for one validating scan of the body and
// a decode of its "usage" members only, instead of a scan plus a decode of every member (it
// runs on every non-stream answer). As encoding/json does, a key matches case-insensitively,
// the last "usage" wins, and a "choices" that is not an array (or null) or a "usage" that does
// not decode fails the whole.
func UsageOf(body []byte) *Usage {
	members, err := jsonscan.Object(body)
	if err != nil {
		return nil
	}
	var u *Usage
	for _, m := range members {
		switch {
		case keyIs(m, "usage"):
			if json.Unmarshal(m.Value, &u) != nil {
				return nil
			}
		case keyIs(m, "choices"):
			if m.Value[0] != '[' && string(m.Value) != "null" {
				return nil
			}
		}
	}
	return u
}

// keyIs reports whether m's key matches name as encoding/json matches a field's name (Unicode
// case folding), decoding the key only when it has escapes.
func keyIs(m jsonscan.Member, name string) bool {
	raw := m.Key[1 : len(m.Key)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return bytes.EqualFold(raw, []byte(name))
	}
	return strings.EqualFold(m.Name(), name)
}

// ErrorType is the OpenAI error type a backend's HTTP status reads as, for a dialect that
// maps another provider's error into an OpenAI error body.
func ErrorType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized, http.StatusForbidden:
		return "authentication_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	}
	return "server_error"
}

// ErrorBody is an OpenAI error body.
func ErrorBody(message, typ, code, param string) []byte {
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	in := inner{Message: message, Type: typ}
	if param != "" {
		in.Param = &param
	}
	if code != "" {
		in.Code = &code
	}
	b, _ := json.Marshal(struct {
		Error inner `json:"error"`
	}{in})
	return b
}

// AppendNamedFrame appends an SSE frame with an event name ("event: <name>\ndata: <data>\n\n").
func AppendNamedFrame(dst []byte, event string, data []byte) []byte {
	if event == "" {
		return AppendFrame(dst, data)
	}
	dst = append(dst, "event: "...)
	dst = append(dst, event...)
	dst = append(dst, '\n')
	return AppendFrame(dst, data)
}

var nullUsageField = []byte(`,"usage":null`)

// WithoutNullUsage returns frames without the "usage":null a backend adds to every chunk when
// usage was asked for: the gateway always asks (it bills from usage), and a client that did
// not ask gets the chunks as the backend would have sent them to it. frames is not modified.
func WithoutNullUsage(frames []byte) []byte {
	if !bytes.Contains(frames, nullUsageField) {
		return frames
	}
	return bytes.ReplaceAll(frames, nullUsageField, nil)
}
