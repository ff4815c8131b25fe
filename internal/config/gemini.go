package config

import (
	"net/url"
	"path"
	"regexp"
	"strings"
)

// geminiVersionRE is the last path segment of a Gemini backend's base_url: the API version
// (v1, v1beta, v1alpha).
var geminiVersionRE = regexp.MustCompile(`^v[0-9]+[a-z0-9]*$`)

// gemini checks the base_url of a Gemini backend: the API's versioned base, below which the
// gateway adds /models/{model}:generateContent (or :streamGenerateContent?alt=sse).
func (v *validator) gemini(p string, b *Backend) {
	if b.Type != TypeGemini {
		return
	}
	u, err := url.Parse(b.BaseURL)
	if err != nil || u.Host == "" { // checkHTTPURL says so
		return
	}
	if !geminiVersionRE.MatchString(path.Base("/" + strings.Trim(u.Path, "/"))) {
		v.add(p+".base_url", "must end in the Gemini API version (e.g. https://generativelanguage.googleapis.com/v1beta): "+
			"the gateway adds /models/{model}:generateContent; got %q", b.BaseURL)
	}
}
