package backend

import (
	"encoding/json"
)

// PrepareAnthropicBody sets "stream" for the execution's mode (Anthropic reports usage in
// message_start and message_delta on its own, so nothing else is added).
func PrepareAnthropicBody(body []byte, stream bool) ([]byte, error) {
	var probe struct {
		Stream *bool `json:"stream"`
	}
	if err := decodeObject(body, &probe); err != nil {
		return nil, err
	}
	if (probe.Stream != nil && *probe.Stream == stream) || (probe.Stream == nil && !stream) {
		return body, nil
	}
	var full map[string]json.RawMessage
	if err := decodeObject(body, &full); err != nil {
		return nil, err
	}
	if stream {
		full["stream"] = json.RawMessage("true")
	} else {
		delete(full, "stream")
	}
	return json.Marshal(full)
}
