package config

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestAzureValidation: an Azure OpenAI backend's endpoint, api_version, deployments and
// continuation are checked, each bad value reported at start-up naming its field; the
// Azure-only fields are refused on other backend types.
func TestAzureValidation(t *testing.T) {
	azure := func(edit func(*Backend)) func(*Config) {
		return func(c *Config) {
			b := Backend{Name: "az", Type: TypeAzure, BaseURL: "https://res.openai.azure.com", APIKeyEnv: "AZURE_OPENAI_API_KEY",
				Models: []string{"gpt-4o", "gpt-4o-mini"}, Timeout: Duration(time.Minute)}
			edit(&b)
			c.Backends = append(c.Backends, b)
		}
	}
	const p = "backends[1]"
	tests := []struct {
		name   string
		mutate func(*Config)
		want   []FieldError // nil: valid
	}{
		{"defaults", azure(func(*Backend) {}), nil},
		{"trailing slash endpoint", azure(func(b *Backend) { b.BaseURL = "https://res.openai.azure.com/" }), nil},
		{"GA version", azure(func(b *Backend) { b.APIVersion = "2024-10-21" }), nil},
		{"preview version", azure(func(b *Backend) { b.APIVersion = "2025-04-01-preview" }), nil},
		{"oldest version with streamed usage", azure(func(b *Backend) { b.APIVersion = "2024-09-01-preview" }), nil},
		{"deployments of listed models", azure(func(b *Backend) {
			b.Deployments = map[string]string{"gpt-4o": "prod-gpt4o_v2.1", "gpt-4o-mini": "mini"}
		}), nil},
		{"deployment of any model on a catch-all", azure(func(b *Backend) {
			b.Models = []string{"*"}
			b.Deployments = map[string]string{"o3": "o3-east"}
		}), nil},
		{"version not dated", azure(func(b *Backend) { b.APIVersion = "v1" }),
			[]FieldError{{p + ".api_version", `must be a dated Azure OpenAI API version, YYYY-MM-DD or YYYY-MM-DD-preview (default 2024-10-21), got "v1"`}}},
		{"version with another suffix", azure(func(b *Backend) { b.APIVersion = "2024-10-21-beta" }),
			[]FieldError{{p + ".api_version", `must be a dated Azure OpenAI API version, YYYY-MM-DD or YYYY-MM-DD-preview (default 2024-10-21), got "2024-10-21-beta"`}}},
		{"version not a date", azure(func(b *Backend) { b.APIVersion = "2024-13-01" }),
			[]FieldError{{p + ".api_version", `must be a real date, YYYY-MM-DD or YYYY-MM-DD-preview, got "2024-13-01"`}}},
		{"version without streamed usage", azure(func(b *Backend) { b.APIVersion = "2024-06-01" }),
			[]FieldError{{p + ".api_version", `must be 2024-09-01 or later (streamed usage, stream_options.include_usage, came in 2024-09-01-preview; the gateway bills from it), got "2024-06-01"`}}},
		{"endpoint with the deployment path", azure(func(b *Backend) { b.BaseURL = "https://res.openai.azure.com/openai/deployments/gpt-4o" }),
			[]FieldError{{p + ".base_url", `must be the Azure OpenAI resource endpoint without a path (e.g. https://my-resource.openai.azure.com): the gateway adds /openai/deployments/{deployment}/chat/completions; got "https://res.openai.azure.com/openai/deployments/gpt-4o"`}}},
		{"no endpoint", azure(func(b *Backend) { b.BaseURL = "" }),
			[]FieldError{{p + ".base_url", `must be an absolute http(s) URL`}}},
		{"deployment of an unlisted model", azure(func(b *Backend) { b.Deployments = map[string]string{"gpt-5": "g5"} }),
			[]FieldError{{p + ".deployments.gpt-5", `model "gpt-5" is not in this backend's models`}}},
		{"deployment name with a slash", azure(func(b *Backend) { b.Deployments = map[string]string{"gpt-4o": "a/b"} }),
			[]FieldError{{p + ".deployments.gpt-4o", `must be a deployment name of 1 to 64 letters, digits, '.', '_' and '-', got "a/b"`}}},
		{"empty deployment name", azure(func(b *Backend) { b.Deployments = map[string]string{"gpt-4o": ""} }),
			[]FieldError{{p + ".deployments.gpt-4o", `must be a deployment name of 1 to 64 letters, digits, '.', '_' and '-', got ""`}}},
		{"vllm continuation", azure(func(b *Backend) { b.Continuation = ContinuationVLLM }),
			[]FieldError{{p + ".continuation", `must be empty for a backend of type azure: Azure OpenAI cannot continue a broken stream`}}},
		{"deployments on an openai backend", func(c *Config) {
			c.Backends = append(c.Backends, Backend{Name: "oa", Type: TypeOpenAI, BaseURL: "https://api.openai.com/v1",
				Models: []string{"gpt-4o"}, Timeout: Duration(time.Minute), Deployments: map[string]string{"gpt-4o": "x"}})
		}, []FieldError{{p + ".deployments", `is only for a backend of type azure, not type "openai"`}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.mutate(c)
			err := c.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Validate() = %v, want %v", err, tt.want)
			}
			if !slices.Equal(ve.Errors, tt.want) {
				t.Errorf("Validate() =\n%v\nwant\n%v", ve.Errors, tt.want)
			}
		})
	}
}

func TestAzureDeploymentAndVersion(t *testing.T) {
	b := Backend{Type: TypeAzure, Deployments: map[string]string{"gpt-4o": "prod-4o"}}
	for _, tt := range []struct{ model, want string }{{"gpt-4o", "prod-4o"}, {"gpt-4o-mini", "gpt-4o-mini"}} {
		if got := b.Deployment(tt.model); got != tt.want {
			t.Errorf("Deployment(%q) = %q, want %q", tt.model, got, tt.want)
		}
	}
	if got := b.AzureAPIVersion(); got != DefaultAzureAPIVersion {
		t.Errorf("AzureAPIVersion() unset = %q, want %q", got, DefaultAzureAPIVersion)
	}
	if got := b.WithDefaults().APIVersion; got != DefaultAzureAPIVersion {
		t.Errorf("WithDefaults().APIVersion = %q, want %q", got, DefaultAzureAPIVersion)
	}
	b.APIVersion = "2025-01-01-preview"
	if got := b.AzureAPIVersion(); got != "2025-01-01-preview" {
		t.Errorf("AzureAPIVersion() = %q", got)
	}
}
