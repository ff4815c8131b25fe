package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Passthrough is one path a backend serves as it is (backends[].passthrough): a POST of a
// JSON body to that path on the gateway is forwarded to the backend's base URL with the
// path's "/v1" prefix dropped (base_url ends in /v1, as for chat), and the answer's status,
// body and Content-Type are stored and replayed. Dedup says which requests are deduplicated.
type Passthrough struct {
	Path  string `yaml:"path"`  // e.g. "/v1/images/generations"
	Dedup string `yaml:"dedup"` // DedupKeyedOnly, DedupOff or DedupOn; unset: DedupOff on ImagesGenerationsPath, else DedupKeyedOnly
}

// Dedup policies of a passthrough path.
const (
	// DedupKeyedOnly deduplicates only requests that carry an Idempotency-Key; a keyless one
	// executes every time (a bypass). The default.
	DedupKeyedOnly = "keyed-only"
	// DedupOff executes every request (a bypass), whatever its key.
	DedupOff = "off"
	// DedupOn deduplicates like chat: an explicit key, or the auto key of the content.
	DedupOn = "on"
)

// ImagesGenerationsPath is OpenAI's image generation: its default policy is DedupOff, since
// "generate a new image" is never a duplicate of the last one.
const ImagesGenerationsPath = "/v1/images/generations"

// Policy is the path's dedup policy: as written, else DedupOff for ImagesGenerationsPath and
// DedupKeyedOnly for any other path.
func (p Passthrough) Policy() string {
	switch {
	case p.Dedup != "":
		return p.Dedup
	case p.Path == ImagesGenerationsPath:
		return DedupOff
	}
	return DedupKeyedOnly
}

// BackendPath is the path below the backend's base URL: Path without its "/v1".
func (p Passthrough) BackendPath() string { return strings.TrimPrefix(p.Path, "/v1") }

// PassthroughTarget is where a passthrough request goes.
type PassthroughTarget struct {
	Path     Passthrough // as the first backend lists it (its policy decides)
	Backends []string    // ordered fallback chain
	// Route is the model's route when the backends came from it (its dedup and degraded
	// settings apply), else a route with dedup on and no model.
	Route RouteTarget
}

// PassthroughPaths is every path some backend lists in its passthrough, sorted, once each.
func (c *Config) PassthroughPaths() []string {
	var paths []string
	for _, b := range c.Backends {
		for _, p := range b.Passthrough {
			paths = append(paths, p.Path)
		}
	}
	slices.Sort(paths)
	return slices.Compact(paths)
}

// ResolvePassthrough picks the backends of a passthrough request for path, whose body names
// model ("" when it names none): when model is routed (Resolve) and backends of its route list
// the path, those, in the route's order (a fallback chain); otherwise the first backend, in
// configuration order, that lists the path, alone. ok is false when no backend lists it.
func (c *Config) ResolvePassthrough(path, model string) (PassthroughTarget, bool) {
	listed := func(name string) (Passthrough, bool) {
		b, ok := c.Backend(name)
		if !ok {
			return Passthrough{}, false
		}
		i := slices.IndexFunc(b.Passthrough, func(p Passthrough) bool { return p.Path == path })
		if i < 0 {
			return Passthrough{}, false
		}
		return b.Passthrough[i], true
	}
	if rt, ok := c.Resolve(model); ok {
		var t PassthroughTarget
		for _, name := range rt.Backends {
			if p, ok := listed(name); ok {
				if len(t.Backends) == 0 {
					t.Path = p
				}
				t.Backends = append(t.Backends, name)
			}
		}
		if len(t.Backends) > 0 {
			t.Route = rt
			return t, true
		}
	}
	for _, b := range c.Backends {
		if p, ok := listed(b.Name); ok {
			return PassthroughTarget{Path: p, Backends: []string{b.Name}, Route: RouteTarget{Backends: []string{b.Name}, Dedup: true}}, true
		}
	}
	return PassthroughTarget{}, false
}

// passthroughPathRE is a passthrough path: /v1/ then segments of letters, digits, '_', '.'
// and '-' (no parameters, wildcards, queries or empty segments).
var passthroughPathRE = regexp.MustCompile(`^/v1(/[A-Za-z0-9_.-]+)+$`)

// reservedPaths are the gateway's own endpoints (and the prefixes of their families): a
// passthrough cannot take them over.
var reservedPaths = []string{"/v1/chat", "/v1/messages", "/v1/embeddings", "/v1/responses", "/v1/jobs",
	"/v1/idempotency", "/v1/models", "/v1/status", "/v1/admin"}

func (v *validator) passthrough(p string, b *Backend) {
	if len(b.Passthrough) > 0 && b.Type != TypeOpenAI && b.Type != TypeOncegate {
		v.add(p+".passthrough", "is for OpenAI-compatible backends (type %s or %s), not type %q", TypeOpenAI, TypeOncegate, b.Type)
		return
	}
	seen := map[string]int{}
	for i, pt := range b.Passthrough {
		pp := fmt.Sprintf("%s.passthrough[%d]", p, i)
		switch {
		case !passthroughPathRE.MatchString(pt.Path) || slices.ContainsFunc(strings.Split(pt.Path, "/"), func(s string) bool { return s == "." || s == ".." }):
			v.add(pp+".path", "must be a path under /v1/ made of segments of letters, digits, '_', '.' and '-' (e.g. %q), got %q", ImagesGenerationsPath, pt.Path)
		case slices.ContainsFunc(reservedPaths, func(r string) bool { return pt.Path == r || strings.HasPrefix(pt.Path, r+"/") }):
			v.add(pp+".path", "%q is one of the gateway's own endpoints, not a passthrough", pt.Path)
		default:
			if j, dup := seen[pt.Path]; dup {
				v.add(pp+".path", "duplicate path %q (also %s.passthrough[%d])", pt.Path, p, j)
			}
			seen[pt.Path] = i
		}
		if pt.Dedup != "" {
			v.oneOf(pp+".dedup", pt.Dedup, DedupKeyedOnly, DedupOff, DedupOn)
		}
	}
}
