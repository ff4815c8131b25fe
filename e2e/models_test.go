package e2e

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/oncegate/oncegate/internal/config"
	"github.com/oncegate/oncegate/internal/mockllm"
	"github.com/oncegate/oncegate/internal/testkit/gatewaykit"
)

// TestModelsListsCatchAllBackends: /v1/models lists, beside the models named in the
// configuration, the models a catch-all backend (models: ["*"], as OPENAI_BASE_URL adds one)
// lists itself at GET /models, owned by it, except those a request would be routed elsewhere
// with; a catch-all backend that cannot be read leaves the list as configured. Before, a
// catch-all backend's models were not listed at all (issue 37).
func TestModelsListsCatchAllBackends(t *testing.T) {
	upstream := httptest.NewServer(mockllm.New(mockllm.Options{Models: []string{"up-a", "up-b", "oncegate-routed"}}))
	defer upstream.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // a catch-all backend nobody answers for
	tests := []struct {
		name string
		base string
		// listed: what the catch-all backend adds to the configured models (each owned by the
		// first backend of its route); oncegate-routed, which it lists too, is routed to the mock.
		listed []string
	}{
		{name: "listed by the backend", base: upstream.URL + "/v1", listed: []string{"up-a", "up-b"}},
		{name: "backend unreachable", base: gone.URL + "/v1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := gatewaykit.Config(t)
			cfg.Backends = append(cfg.Backends, config.Backend{Name: "up", Type: config.TypeOpenAI, BaseURL: tc.base,
				Models: []string{config.CatchAll}, Timeout: config.Duration(time.Minute)})
			cfg.Routes = append(cfg.Routes, config.Route{Model: "oncegate-routed", Backends: []string{config.MockBackendName}})
			want := map[string]string{}
			for _, n := range cfg.ModelNames() {
				rt, _ := cfg.Resolve(n)
				want[n] = rt.Backends[0]
			}
			if want["oncegate-routed"] != config.MockBackendName {
				t.Fatalf("configured models %v", want)
			}
			for _, n := range tc.listed {
				want[n] = "up"
			}
			gw := gatewaykit.StartGateway(t, cfg)
			r := do(t, http.MethodGet, gw.URL+"/v1/models", "", nil)
			if r.Status != http.StatusOK {
				t.Fatalf("/v1/models %d %s", r.Status, r.Body)
			}
			var list struct {
				Data []struct {
					ID      string `json:"id"`
					OwnedBy string `json:"owned_by"`
				} `json:"data"`
			}
			if err := json.Unmarshal([]byte(r.Body), &list); err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			var ids []string
			for _, m := range list.Data {
				got[m.ID] = m.OwnedBy
				ids = append(ids, m.ID)
			}
			if len(got) != len(list.Data) || len(got) != len(want) {
				t.Fatalf("/v1/models lists %s, want %v", r.Body, want)
			}
			for id, owner := range want {
				if got[id] != owner {
					t.Errorf("model %q owned by %q, want %q (list %s)", id, got[id], owner, r.Body)
				}
			}
			if !slices.IsSorted(ids) {
				t.Errorf("not sorted by id: %v", ids)
			}
		})
	}
}
