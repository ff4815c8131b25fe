package gateway

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/oncegate/oncegate/httpapi"
	"github.com/oncegate/oncegate/internal/backend"
	"github.com/oncegate/oncegate/internal/config"
)

// Model lists of catch-all backends (models: ["*"], e.g. the one OPENAI_BASE_URL adds): read
// from the backend at most every modelsFresh, each read bounded by modelsAsk. A read that
// fails keeps the last list (or none): /v1/models never fails for a backend's sake.
const (
	modelsFresh = time.Minute
	modelsAsk   = 2 * time.Second
)

// modelCatalog is httpapi.ModelCatalog for the configured catch-all backends.
type modelCatalog struct {
	backends []*backend.Client
	log      zerolog.Logger

	mu    sync.Mutex // held across a read: concurrent /v1/models wait for one read
	lists map[string][]string
	read  map[string]time.Time
}

// newModelCatalog returns the catalog of cfg's catch-all backends, nil when there are none.
func newModelCatalog(cfg *config.Config, getenv func(string) string, log zerolog.Logger) (*modelCatalog, error) {
	m := &modelCatalog{log: log, lists: map[string][]string{}, read: map[string]time.Time{}}
	for _, b := range cfg.Backends {
		if !slices.Contains(b.Models, config.CatchAll) {
			continue
		}
		c, err := backend.New(b, getenv)
		if err != nil {
			return nil, err
		}
		m.backends = append(m.backends, c)
	}
	if len(m.backends) == 0 {
		return nil, nil
	}
	return m, nil
}

// CatchAllModels lists every catch-all backend's models, read again when older than
// modelsFresh.
func (m *modelCatalog) CatchAllModels(ctx context.Context) []httpapi.CatalogModel {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []httpapi.CatalogModel
	for _, c := range m.backends {
		name := c.Name()
		if time.Since(m.read[name]) >= modelsFresh {
			actx, cancel := context.WithTimeout(ctx, modelsAsk)
			ids, err := c.ListModels(actx)
			cancel()
			m.read[name] = time.Now() // a failure is not asked again at once either
			if err != nil {
				m.log.Warn().Err(err).Str("backend", name).Msg("reading a catch-all backend's model list for /v1/models; keeping the last one")
			} else {
				m.lists[name] = ids
			}
		}
		for _, id := range m.lists[name] {
			out = append(out, httpapi.CatalogModel{ID: id, Backend: name})
		}
	}
	return out
}

// catalog is m as an httpapi.ModelCatalog: nil (no catch-all backend) stays a nil interface.
func catalog(m *modelCatalog) httpapi.ModelCatalog {
	if m == nil {
		return nil
	}
	return m
}
