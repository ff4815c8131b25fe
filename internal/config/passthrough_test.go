package config

import (
	"errors"
	"slices"
	"testing"
)

// passthroughConfig has two OpenAI-compatible backends that both list /v1/moderations, a
// route of gpt-4o over both, and a mock.
func passthroughConfig() *Config {
	c := Default()
	c.Backends = append(c.Backends,
		Backend{Name: "first", Type: TypeOpenAI, BaseURL: "http://127.0.0.1:9/v1", Models: []string{"gpt-4o-mini"},
			Timeout: Duration(DefaultBackendTimeout), Passthrough: []Passthrough{{Path: "/v1/moderations"}, {Path: ImagesGenerationsPath}}},
		Backend{Name: "second", Type: TypeOpenAI, BaseURL: "http://127.0.0.1:10/v1", Models: []string{"gpt-4o"},
			Timeout: Duration(DefaultBackendTimeout), Passthrough: []Passthrough{{Path: "/v1/moderations", Dedup: DedupOn}, {Path: "/v1/audio/speech", Dedup: DedupOff}}},
	)
	c.Routes = []Route{{Model: "gpt-4o", Backends: []string{"second", "first"}}, {Model: "oncegate-mock", Backends: []string{"mock"}}}
	return c
}

// TestPassthroughPolicy: keyed-only unless written, image generation off unless written.
func TestPassthroughPolicy(t *testing.T) {
	for _, tc := range []struct {
		p    Passthrough
		want string
	}{
		{Passthrough{Path: "/v1/moderations"}, DedupKeyedOnly},
		{Passthrough{Path: ImagesGenerationsPath}, DedupOff},
		{Passthrough{Path: ImagesGenerationsPath, Dedup: DedupKeyedOnly}, DedupKeyedOnly},
		{Passthrough{Path: "/v1/moderations", Dedup: DedupOn}, DedupOn},
		{Passthrough{Path: "/v1/moderations", Dedup: DedupOff}, DedupOff},
	} {
		if got := tc.p.Policy(); got != tc.want {
			t.Errorf("%+v.Policy() = %q, want %q", tc.p, got, tc.want)
		}
	}
	if got := (Passthrough{Path: "/v1/images/generations"}).BackendPath(); got != "/images/generations" {
		t.Errorf("BackendPath = %q", got)
	}
}

// TestResolvePassthrough: the body's routed model picks its route's backends that list the
// path (in the route's order); anything else gets the first backend that lists it.
func TestResolvePassthrough(t *testing.T) {
	c := passthroughConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.PassthroughPaths(), []string{"/v1/audio/speech", "/v1/images/generations", "/v1/moderations"}; !slices.Equal(got, want) {
		t.Errorf("PassthroughPaths = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		name, path, model string
		backends          []string
		policy            string
		ok                bool
	}{
		{"routed model, both list it", "/v1/moderations", "gpt-4o", []string{"second", "first"}, DedupOn, true},
		{"backend's own model", "/v1/moderations", "gpt-4o-mini", []string{"first"}, DedupKeyedOnly, true},
		{"no model", "/v1/moderations", "", []string{"first"}, DedupKeyedOnly, true},
		{"unknown model", "/v1/moderations", "text-moderation-9", []string{"first"}, DedupKeyedOnly, true},
		{"routed model, no backend of its route lists it", "/v1/moderations", "oncegate-mock", []string{"first"}, DedupKeyedOnly, true},
		{"routed model, one of its backends lists it", "/v1/audio/speech", "gpt-4o", []string{"second"}, DedupOff, true},
		{"listed by a later backend only", "/v1/audio/speech", "", []string{"second"}, DedupOff, true},
		{"images default off", ImagesGenerationsPath, "gpt-4o", []string{"first"}, DedupOff, true},
		{"unlisted", "/v1/files", "gpt-4o", nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := c.ResolvePassthrough(tc.path, tc.model)
			if ok != tc.ok || !slices.Equal(got.Backends, tc.backends) || ok && got.Path.Policy() != tc.policy {
				t.Fatalf("ResolvePassthrough(%q, %q) = %+v (policy %q), %v; want %v, %q, %v", tc.path, tc.model, got, got.Path.Policy(), ok,
					tc.backends, tc.policy, tc.ok)
			}
			if ok && !got.Route.Dedup {
				t.Errorf("route dedup off: %+v", got.Route)
			}
			if routed := len(tc.backends) > 1 || tc.name == "routed model, one of its backends lists it" || tc.name == "backend's own model" || tc.name == "images default off"; ok &&
				(got.Route.Model != "") != routed {
				t.Errorf("route model %q (routed: %v)", got.Route.Model, routed)
			}
		})
	}
}

// TestPassthroughValidation: each rule of backends[].passthrough, alone.
func TestPassthroughValidation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend int // index in passthroughConfig's backends
		set     []Passthrough
		path    string // the one field error expected; "" for none
	}{
		{"valid", 1, []Passthrough{{Path: "/v1/moderations"}, {Path: "/v1/audio/speech", Dedup: DedupOn}, {Path: "/v1/x.y/z_1-2", Dedup: DedupKeyedOnly}}, ""},
		{"not under /v1", 1, []Passthrough{{Path: "/moderations"}}, "backends[1].passthrough[0].path"},
		{"trailing slash", 1, []Passthrough{{Path: "/v1/moderations/"}}, "backends[1].passthrough[0].path"},
		{"dot segment", 1, []Passthrough{{Path: "/v1/./moderations"}}, "backends[1].passthrough[0].path"},
		{"parameter", 1, []Passthrough{{Path: "/v1/files/:id"}}, "backends[1].passthrough[0].path"},
		{"wildcard", 1, []Passthrough{{Path: "/v1/*"}}, "backends[1].passthrough[0].path"},
		{"query", 1, []Passthrough{{Path: "/v1/moderations?x=1"}}, "backends[1].passthrough[0].path"},
		{"empty", 1, []Passthrough{{}}, "backends[1].passthrough[0].path"},
		{"gateway's own", 1, []Passthrough{{Path: "/v1/responses/x/cancel"}}, "backends[1].passthrough[0].path"},
		{"jobs", 1, []Passthrough{{Path: "/v1/jobs"}}, "backends[1].passthrough[0].path"},
		{"prefix is not a family", 1, []Passthrough{{Path: "/v1/modelsx"}}, ""},
		{"duplicate", 1, []Passthrough{{Path: "/v1/moderations"}, {Path: "/v1/moderations", Dedup: DedupOff}}, "backends[1].passthrough[1].path"},
		{"unknown policy", 1, []Passthrough{{Path: "/v1/moderations", Dedup: "always"}}, "backends[1].passthrough[0].dedup"},
		{"mock backend", 0, []Passthrough{{Path: "/v1/moderations"}}, "backends[0].passthrough"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := passthroughConfig()
			c.Backends[tc.backend].Passthrough = tc.set
			err := c.Validate()
			if tc.path == "" {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Errors) != 1 || ve.Errors[0].Path != tc.path {
				t.Fatalf("Validate() = %v, want one error at %s", err, tc.path)
			}
		})
	}
}
