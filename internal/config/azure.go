package config

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Deployment is the Azure OpenAI deployment model is sent to: its entry in Deployments, else
// the model's own name (deployments are often named after their model).
func (b Backend) Deployment(model string) string {
	if d, ok := b.Deployments[model]; ok {
		return d
	}
	return model
}

// AzureAPIVersion is the api-version an Azure OpenAI backend sends: APIVersion, else
// DefaultAzureAPIVersion.
func (b Backend) AzureAPIVersion() string {
	if b.APIVersion == "" {
		return DefaultAzureAPIVersion
	}
	return b.APIVersion
}

var (
	azureAPIVersionRE = regexp.MustCompile(`^(\d{4}-\d{2}-\d{2})(-preview)?$`)
	azureDeploymentRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// azureMinAPIVersion is the first api-version that streams usage (stream_options.
// include_usage, added in 2024-09-01-preview): an older one refuses every stream the
// gateway sends.
const azureMinAPIVersion = "2024-09-01"

// azure checks the fields of an Azure OpenAI backend, and that other backends leave them out.
func (v *validator) azure(p string, b *Backend) {
	if b.Type != TypeAzure {
		if len(b.Deployments) > 0 {
			v.add(p+".deployments", "is only for a backend of type %s, not type %q", TypeAzure, b.Type)
		}
		return
	}
	if u, err := url.Parse(b.BaseURL); err == nil && u.Host != "" && strings.Trim(u.Path, "/") != "" {
		v.add(p+".base_url", "must be the Azure OpenAI resource endpoint without a path (e.g. https://my-resource.openai.azure.com): the gateway adds /openai/deployments/{deployment}/chat/completions; got %q", b.BaseURL)
	}
	if b.APIVersion != "" {
		m := azureAPIVersionRE.FindStringSubmatch(b.APIVersion)
		switch {
		case m == nil:
			v.add(p+".api_version", "must be a dated Azure OpenAI API version, YYYY-MM-DD or YYYY-MM-DD-preview (default %s), got %q", DefaultAzureAPIVersion, b.APIVersion)
		case !validDate(m[1]):
			v.add(p+".api_version", "must be a real date, YYYY-MM-DD or YYYY-MM-DD-preview, got %q", b.APIVersion)
		case m[1] < azureMinAPIVersion:
			v.add(p+".api_version", "must be %s or later (streamed usage, stream_options.include_usage, came in %s-preview; the gateway bills from it), got %q", azureMinAPIVersion, azureMinAPIVersion, b.APIVersion)
		}
	}
	if b.Continuation == ContinuationVLLM {
		v.add(p+".continuation", "must be empty for a backend of type %s: Azure OpenAI cannot continue a broken stream", TypeAzure)
	}
	catchAll := slices.Contains(b.Models, CatchAll)
	for model, dep := range b.Deployments {
		dp := fmt.Sprintf("%s.deployments.%s", p, model)
		if !catchAll && !slices.Contains(b.Models, model) {
			v.add(dp, "model %q is not in this backend's models", model)
		}
		if !azureDeploymentRE.MatchString(dep) {
			v.add(dp, "must be a deployment name of 1 to 64 letters, digits, '.', '_' and '-', got %q", dep)
		}
	}
}

func validDate(s string) bool {
	_, err := time.Parse(time.DateOnly, s)
	return err == nil
}
