package dialect_test

import (
	"errors"
	"testing"

	"github.com/oncegate/oncegate/dialect"
	"github.com/oncegate/oncegate/dialect/dialects"
	"github.com/oncegate/oncegate/dialect/openai"
)

// TestRegistryFor: a backend type claimed by a dialect takes only that dialect's API; every
// other type takes the gateway's own wire of the request's API.
func TestRegistryFor(t *testing.T) {
	r := dialects.Registry()
	tests := []struct {
		name, backendType, api string
		want                   string // dialect name; "" for ErrUnsupported
	}{
		{"openai on openai", "openai", dialect.APIOpenAI, "openai"},
		{"openai on the mock", "mock", dialect.APIOpenAI, "openai"},
		{"messages on openai", "openai", dialect.APIAnthropic, "anthropic"},
		{"messages on oncegate", "oncegate", dialect.APIAnthropic, "anthropic"},
		{"native responses", "openai", dialect.APIResponses, "responses"},
		{"an API no dialect speaks", "openai", "embeddings", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := r.For(tt.backendType, tt.api)
			switch {
			case tt.want == "" && !errors.Is(err, dialect.ErrUnsupported):
				t.Fatalf("For(%s, %s) = %v, %v; want ErrUnsupported", tt.backendType, tt.api, d, err)
			case tt.want != "" && (err != nil || d.Name() != tt.want):
				t.Fatalf("For(%s, %s) = %v, %v; want %s", tt.backendType, tt.api, d, err, tt.want)
			}
		})
	}
}

// claimed is a dialect specific to one backend type.
type claimed struct{ openai.Dialect }

func (claimed) Name() string        { return "claimed" }
func (claimed) BackendType() string { return "special" }

// TestRegistryClaimedType: a type a dialect claims never falls back to the general dialect
// of another API (its backend would get a wire it does not speak).
func TestRegistryClaimedType(t *testing.T) {
	r, err := dialect.NewRegistry(append(dialects.All(), claimed{})...)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := r.For("special", dialect.APIOpenAI); err != nil || d.Name() != "claimed" {
		t.Errorf("For(special, openai) = %v, %v; want claimed", d, err)
	}
	if d, err := r.For("special", dialect.APIAnthropic); !errors.Is(err, dialect.ErrUnsupported) {
		t.Errorf("For(special, anthropic) = %v, %v; want ErrUnsupported", d, err)
	}
	if d := r.Client(dialect.APIOpenAI); d.Name() != "openai" {
		t.Errorf("Client(openai) = %s, want the general openai dialect", d.Name())
	}
	if d := r.Client("embeddings"); d.Name() != "openai" {
		t.Errorf("Client(embeddings) = %s, want openai (whose errors embeddings use)", d.Name())
	}
}

// TestRegistryRefusesTwoDialectsForOneKey: two dialects of one backend type and API are a
// table error, not a silent override.
func TestRegistryRefusesTwoDialectsForOneKey(t *testing.T) {
	if _, err := dialect.NewRegistry(append(dialects.All(), openai.New())...); err == nil {
		t.Fatal("a second openai dialect was accepted")
	}
}
