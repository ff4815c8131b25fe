package docs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository, seen from this package.
const root = ".."

// pages are README.md and every Markdown file under docs/, as paths from the root.
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			out = append(out, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLinks: every relative link and image of README.md and docs/**/*.md names a file or
// directory of the repository, and every #anchor a heading of the page it points to.
func TestLinks(t *testing.T) {
	ps := pages(t)
	if len(ps) < 10 {
		t.Fatalf("found %d pages, expected README.md and the docs pages: %v", len(ps), ps)
	}
	for _, problem := range checkLinks(root, ps) {
		t.Error(problem)
	}
}

// TestLinkCheckFinds shows the check on a small tree: a missing file, a missing anchor and a
// link out of the tree are found; good links, links inside code and absolute URLs are not.
func TestLinkCheckFinds(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"README.md": "# Top\n\n[ok](docs/a.md) [ok anchor](docs/a.md#a-section-two) [self](#top) " +
			"[web](https://example.com/x.md) `[code](nowhere.md)`\n\n```sh\n[block](nowhere.md)\n```\n" +
			"[missing](docs/b.md) [bad anchor](docs/a.md#nope) [escape](../outside.md)\n",
		"docs/a.md": "# A\n\n## A section `two`\n\n![img](../README.md)\n",
	}
	for p, s := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := checkLinks(dir, []string{"README.md", "docs/a.md"})
	want := []string{"docs/b.md", "docs/a.md#nope", "../outside.md"}
	if len(got) != len(want) {
		t.Fatalf("found %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		if !strings.Contains(got[i], "("+w+")") {
			t.Errorf("problem %d is %q, want one about (%s)", i+1, got[i], w)
		}
	}
}

var (
	fenceRE  = regexp.MustCompile("(?ms)^```.*?^```")
	inlineRE = regexp.MustCompile("`[^`\n]*`")
	linkRE   = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)
)

// checkLinks returns one line per broken link of the files (paths from dir).
func checkLinks(dir string, files []string) []string {
	var problems []string
	anchors := map[string][]string{} // file -> its headings' anchors
	anchorsOf := func(file string) []string {
		if a, ok := anchors[file]; ok {
			return a
		}
		b, _ := os.ReadFile(filepath.Join(dir, file))
		anchors[file] = headingAnchors(string(b))
		return anchors[file]
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		text := inlineRE.ReplaceAllString(fenceRE.ReplaceAllString(string(b), ""), "")
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
				if strings.HasPrefix(dest, "..") {
					problems = append(problems, fmt.Sprintf("%s: (%s) points out of the repository", f, target))
					continue
				}
				if _, err := os.Stat(filepath.Join(dir, dest)); err != nil {
					problems = append(problems, fmt.Sprintf("%s: (%s): no such file", f, target))
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") && !slices.Contains(anchorsOf(dest), anchor) {
				problems = append(problems, fmt.Sprintf("%s: (%s): %s has no heading with that anchor (it has %s)",
					f, target, dest, strings.Join(anchorsOf(dest), ", ")))
			}
		}
	}
	return problems
}

// headingAnchors are the anchors GitHub gives a page's headings: lower case, punctuation but
// '-' and '_' dropped, spaces as '-', a repeated anchor numbered -1, -2, ….
func headingAnchors(page string) []string {
	var out []string
	seen := map[string]int{}
	for _, l := range strings.Split(fenceRE.ReplaceAllString(page, ""), "\n") {
		if !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '—' && r != '…' && r != '→':
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a] = n + 1
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out = append(out, a)
	}
	return out
}

// sources is the text of the non-test Go files of a package directory (from the root).
func sources(t *testing.T, dir string) string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		s, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(s)
	}
	return b.String()
}

// matches is every first submatch of the expressions in src, sorted, without repeats.
func matches(src string, exprs ...string) []string {
	var out []string
	for _, e := range exprs {
		for _, m := range regexp.MustCompile(e).FindAllStringSubmatch(src, -1) {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func readPage(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAPIPageNamesEveryRouteAndCode: docs/api.md names every route httpapi registers (as
// `METHOD /path`, path parameters as {name}) and every error code httpapi and the workers
// answer with (as `code`), so a new route or code fails here until it is documented.
func TestAPIPageNamesEveryRouteAndCode(t *testing.T) {
	page := readPage(t, filepath.Join("docs", "api.md"))
	src := sources(t, "httpapi")
	routeRE := regexp.MustCompile(`(\w+(?:\.app)?)\.(Get|Post|Delete|Put|Patch)\("(/[^"]*)"`)
	paramRE := regexp.MustCompile(`:(\w+)`)
	var routes []string
	for _, m := range routeRE.FindAllStringSubmatch(src, -1) {
		path := paramRE.ReplaceAllString(m[3], "{$1}")
		if m[1] == "r" || m[1] == "v1" { // the /v1 group
			path = "/v1" + path
		}
		routes = append(routes, strings.ToUpper(m[2])+" "+path)
	}
	if len(routes) < 20 {
		t.Fatalf("found %d routes in httpapi, expected at least 20: the pattern no longer matches how routes are registered", len(routes))
	}
	for _, r := range routes {
		if !strings.Contains(page, "`"+r+"`") && !strings.Contains(page, "`"+r+"?") {
			t.Errorf("docs/api.md does not name the route `%s`", r)
		}
	}
	codes := matches(src+sources(t, "workers"),
		`Code: *"([a-z_]+)"`, `invalid\(http\.Status\w+, "([a-z_]+)"`, `badRequest\("([a-z_]+)"`, `errorBody\([^,\n]+, "([a-z_]+)"`)
	if len(codes) < 30 {
		t.Fatalf("found %d error codes, expected at least 30: the patterns no longer match how errors are built", len(codes))
	}
	for _, c := range codes {
		if !strings.Contains(page, "`"+c+"`") {
			t.Errorf("docs/api.md does not name the error code `%s`", c)
		}
	}
}

// TestTroubleshootingNamesEveryStartFailure: docs/operations/troubleshooting.md names the
// setting of every gateway.StartError and every hint the binary adds to a failed start.
func TestTroubleshootingNamesEveryStartFailure(t *testing.T) {
	page := readPage(t, filepath.Join("docs", "operations", "troubleshooting.md"))
	fields := matches(sources(t, "gateway"), `StartError\{Field: "([a-z_.]+)"`)
	hints := matches(sources(t, filepath.Join("cmd", "oncegate")), `return msg \+ "; ([^"]+)"`)
	if len(fields) < 5 || len(hints) < 5 {
		t.Fatalf("found %d start-error settings and %d hints, expected at least 5 of each: the patterns no longer match", len(fields), len(hints))
	}
	for _, f := range fields {
		if !strings.Contains(page, "`"+f+"`") {
			t.Errorf("troubleshooting.md does not name the start failure of `%s`", f)
		}
	}
	for _, h := range hints {
		if !strings.Contains(page, h) {
			t.Errorf("troubleshooting.md does not show the hint %q", h)
		}
	}
}

// TestBackendsPageNamesEveryType: the opening of docs/backends.md (its list of types) names
// every backend type internal/config accepts, as `type: NAME`, and each type with a dialect
// of its own (a package under dialect/ naming a config.Type) has a section that opens with it.
func TestBackendsPageNamesEveryType(t *testing.T) {
	page := readPage(t, filepath.Join("docs", "backends.md"))
	opening, _, _ := strings.Cut(page, "\n## ")
	types := matches(sources(t, filepath.Join("internal", "config")), `\bType\w+ += "([a-z]+)"`)
	if len(types) < 5 {
		t.Fatalf("found %d backend types in internal/config, expected at least 5: the pattern no longer matches", len(types))
	}
	for _, typ := range types {
		if !strings.Contains(opening, "`type: "+typ+"`") {
			t.Errorf("the opening of docs/backends.md does not name `type: %s`", typ)
		}
	}
	dirs, err := filepath.Glob(filepath.Join(root, "dialect", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var own []string
	for _, d := range dirs {
		rel, _ := filepath.Rel(root, d)
		own = append(own, matches(sources(t, rel), `BackendType = config\.Type(\w+)`)...)
	}
	if len(own) < 2 {
		t.Fatalf("found %d dialects of their own backend type, expected at least 2 (azure, gemini): the pattern no longer matches", len(own))
	}
	sections := strings.Split(page, "\n## ")[1:]
	for _, name := range own {
		typ := "`type: " + strings.ToLower(name) + "`"
		if !slices.ContainsFunc(sections, func(sec string) bool {
			_, text, _ := strings.Cut(sec, "\n")
			return strings.HasPrefix(strings.TrimSpace(text), typ)
		}) {
			t.Errorf("docs/backends.md has no section that opens with %s (its dialect of its own)", typ)
		}
	}
}

// TestFencesClosed: every page's ``` fences pair up, so no code block swallows the text after
// it (and the command tests, which read ```sh blocks, see every block).
func TestFencesClosed(t *testing.T) {
	for _, p := range pages(t) {
		n := 0
		for _, l := range strings.Split(readPage(t, p), "\n") {
			if strings.HasPrefix(l, "```") {
				n++
			}
		}
		if n%2 != 0 {
			t.Errorf("%s has %d ``` fence lines: one block is not closed", p, n)
		}
	}
}
