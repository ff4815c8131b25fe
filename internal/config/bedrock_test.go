package config

import (
	"strings"
	"testing"
)

// TestBedrockValidation: a Bedrock backend needs a region (its own, or its base_url's host's),
// the runtime endpoint without a path, no API key and no continuation; region and model_ids
// belong to type bedrock only. Each problem names its field.
func TestBedrockValidation(t *testing.T) {
	const host = "https://bedrock-runtime.eu-central-1.amazonaws.com"
	for _, tt := range []struct {
		name string
		b    Backend
		want string // a substring of the problems; "" for none
	}{
		{"region from the host", Backend{Type: TypeBedrock, BaseURL: host}, ""},
		{"region of its own", Backend{Type: TypeBedrock, BaseURL: "http://127.0.0.1:9000", Region: "us-west-2"}, ""},
		{"no region", Backend{Type: TypeBedrock, BaseURL: "http://127.0.0.1:9000"}, "backends[1].region: must be set"},
		{"a bad region", Backend{Type: TypeBedrock, BaseURL: host, Region: "Frankfurt"}, "backends[1].region: must be an AWS region"},
		{"a path", Backend{Type: TypeBedrock, BaseURL: host + "/model"}, "backends[1].base_url: must be the Bedrock runtime endpoint without a path"},
		{"an API key", Backend{Type: TypeBedrock, BaseURL: host, APIKeyEnv: "AWS_KEY"}, "backends[1].api_key_env: must be empty for a backend of type bedrock"},
		{"continuation", Backend{Type: TypeBedrock, BaseURL: host, Continuation: ContinuationVLLM}, "backends[1].continuation: must be empty for a backend of type bedrock"},
		{"region elsewhere", Backend{Type: TypeOpenAI, BaseURL: host, Region: "us-east-1"}, "backends[1].region: is only for a backend of type bedrock"},
		{"model ids elsewhere", Backend{Type: TypeOpenAI, BaseURL: host, ModelIDs: map[string]string{"m": "id"}}, "backends[1].model_ids: is only for a backend of type bedrock"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.b.Name, tt.b.Models = "b", []string{"claude"}
			got := backendProblems(tt.b)
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Errorf("problems %q, want %q", got, tt.want)
			}
		})
	}
	b := Backend{Type: TypeBedrock, BaseURL: host, ModelIDs: map[string]string{"claude": "anthropic.claude-v2:1"}}
	if b.BedrockRegion() != "eu-central-1" || b.BedrockModelID("claude") != "anthropic.claude-v2:1" || b.BedrockModelID("nova") != "nova" {
		t.Errorf("region %q, ids %q %q", b.BedrockRegion(), b.BedrockModelID("claude"), b.BedrockModelID("nova"))
	}
}
