package config

import (
	"net/url"
	"regexp"
	"strings"
)

// bedrockHostRE is a Bedrock runtime endpoint's host; its group is the region.
var bedrockHostRE = regexp.MustCompile(`^bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$`)

// regionRE is an AWS region name (us-east-1, eu-central-2, us-gov-west-1).
var regionRE = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)

// BedrockRegion is the region a Bedrock backend signs for: region, else the one in its
// base_url's host; "" when neither says.
func (b Backend) BedrockRegion() string {
	if b.Region != "" {
		return b.Region
	}
	if u, err := url.Parse(b.BaseURL); err == nil {
		if m := bedrockHostRE.FindStringSubmatch(u.Hostname()); m != nil {
			return m[1]
		}
	}
	return ""
}

// BedrockModelID is the Bedrock model id (or inference profile) model is sent to.
func (b Backend) BedrockModelID(model string) string {
	if id := b.ModelIDs[model]; id != "" {
		return id
	}
	return model
}

// bedrock checks a Bedrock backend: a runtime endpoint without a path, a region, no API key
// (requests are signed with SigV4 from the AWS credential chain), no continuation; and that
// region and model_ids are set for type bedrock only.
func (v *validator) bedrock(p string, b *Backend) {
	if b.Type != TypeBedrock {
		if b.Region != "" {
			v.add(p+".region", "is only for a backend of type %s, not type %q", TypeBedrock, b.Type)
		}
		if len(b.ModelIDs) > 0 {
			v.add(p+".model_ids", "is only for a backend of type %s, not type %q", TypeBedrock, b.Type)
		}
		return
	}
	if u, err := url.Parse(b.BaseURL); err == nil && u.Host != "" && strings.Trim(u.Path, "/") != "" {
		v.add(p+".base_url", "must be the Bedrock runtime endpoint without a path (e.g. https://bedrock-runtime.us-east-1.amazonaws.com): the gateway adds /model/{model id}/converse; got %q", b.BaseURL)
	}
	switch r := b.BedrockRegion(); {
	case r == "":
		v.add(p+".region", "must be set when base_url's host does not name the region (bedrock-runtime.{region}.amazonaws.com)")
	case !regionRE.MatchString(r):
		v.add(p+".region", "must be an AWS region such as us-east-1, got %q", r)
	}
	if b.APIKeyEnv != "" {
		v.add(p+".api_key_env", "must be empty for a backend of type %s: requests are signed with SigV4 from the AWS credential chain (AWS_ACCESS_KEY_ID…, AWS_PROFILE, a role)", TypeBedrock)
	}
	if b.Continuation != "" {
		v.add(p+".continuation", "must be empty for a backend of type %s: Bedrock cannot continue a broken stream", TypeBedrock)
	}
	for m, id := range b.ModelIDs {
		if strings.TrimSpace(id) == "" {
			v.add(p+".model_ids."+m, "must not be empty")
		}
	}
}
