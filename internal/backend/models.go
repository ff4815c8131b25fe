package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/oncegate/oncegate/internal/config"
)

// ErrNoModelList: the backend's API has no model list this client reads (only the
// OpenAI-compatible GET /models, which Anthropic's API shares, is read).
var ErrNoModelList = errors.New("backend: no model list for this backend type")

// maxModelList bounds the model list's body.
const maxModelList = 1 << 20

// ListModels asks the backend which models it serves: GET {base_url}/models, the
// {"data": [{"id": …}]} list of OpenAI-compatible servers (vLLM, Ollama, OpenAI) and of
// Anthropic's API. /v1/models lists them for a backend that serves every model nobody else
// does (models: ["*"]).
func (c *Client) ListModels(ctx context.Context) ([]string, error) {
	switch c.cfg.Type {
	case config.TypeOpenAI, config.TypeOncegate, config.TypeMock, config.TypeAnthropic:
	default:
		return nil, fmt.Errorf("%w: %s", ErrNoModelList, c.cfg.Type)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.baseURL+"/models", nil)
	if err != nil {
		return nil, fmt.Errorf("backend %s: models: %w", c.cfg.Name, err)
	}
	req.Header.Set("Accept", "application/json")
	if c.apiKey != "" {
		if c.cfg.Type == config.TypeAnthropic {
			req.Header.Set("x-api-key", c.apiKey)
			req.Header.Set("anthropic-version", c.cfg.AnthropicVersion)
		} else {
			req.Header.Set("Authorization", "Bearer "+c.apiKey)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("backend %s: models: %w", c.cfg.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxModelList))
	if err != nil {
		return nil, fmt.Errorf("backend %s: models: %w", c.cfg.Name, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("backend %s: models: status %d", c.cfg.Name, resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("backend %s: models: %w", c.cfg.Name, err)
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" {
			ids = append(ids, m.ID)
		}
	}
	return ids, nil
}
