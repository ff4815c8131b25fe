package config

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Problem is one error of a configuration file, placed where the file has it.
type Problem struct {
	// Line is the 1-based line in the file, 0 when the problem has no place in it (a value
	// set by the environment, a section the file does not write).
	Line int
	// Path is the YAML path ("idempotency.auto_window", "backends[1].base_url"); empty for
	// the document itself (a syntax error).
	Path    string
	Message string
}

func (p Problem) text() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// FileError lists every problem of a configuration file: syntax, unknown fields (with the
// closest known name), values of the wrong type and the validation rules, in line order.
// A syntax error stops decoding, so it comes alone. It matches [ErrInvalid].
type FileError struct {
	File     string // as given to [Load]; empty for [Parse]
	Problems []Problem
}

// Error returns one line per problem, "file:line: path: message" (the line is left out when
// the problem has none; "line N: …" when there is no file name).
func (e *FileError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		switch {
		case e.File != "" && p.Line > 0:
			lines[i] = fmt.Sprintf("%s:%d: %s", e.File, p.Line, p.text())
		case e.File != "":
			lines[i] = e.File + ": " + p.text()
		case p.Line > 0:
			lines[i] = fmt.Sprintf("line %d: %s", p.Line, p.text())
		default:
			lines[i] = p.text()
		}
	}
	return strings.Join(lines, "\n")
}

// Is reports whether target is [ErrInvalid].
func (e *FileError) Is(target error) bool { return target == ErrInvalid }

// yamlLineRE finds the line yaml.v3 puts in its error messages ("yaml: line 4: …",
// "line 4: …").
var yamlLineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): `)

// checkedDecode decodes data over Default() and returns it with every problem found before
// validation. Unknown fields and wrong types are found by walking the document against
// Config's yaml tags (yaml.v3's KnownFields stops at the first unknown field and names Go
// types, not paths). lines maps each YAML path to the line where the file writes it.
func checkedDecode(data []byte) (c *Config, problems []Problem, lines map[string]int) {
	c = Default()
	lines = map[string]int{}
	var doc yaml.Node
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&doc); err != nil {
		if isEOF(err) {
			return c, nil, lines
		}
		return nil, []Problem{syntaxProblem(err)}, lines
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case isEOF(err):
	case err != nil:
		return nil, []Problem{syntaxProblem(err)}, lines
	default:
		return nil, []Problem{{Line: extra.Line, Message: "only one YAML document is allowed"}}, lines
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	w := walker{lines: lines}
	w.walk(root, reflect.TypeFor[Config](), "")
	problems = w.problems

	// The values: an unknown field is skipped here and a wrong-typed value keeps its default
	// (both are reported above), so the validation below sees what the file meant elsewhere.
	// Type errors the walk did not see (none are known) are kept, placed by their line.
	if err := doc.Decode(c); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, append(problems, syntaxProblem(err)), lines
		}
		seen := map[int]bool{}
		for _, p := range problems {
			seen[p.Line] = true
		}
		for _, msg := range te.Errors {
			p := syntaxProblem(errors.New(msg))
			if !seen[p.Line] {
				problems = append(problems, p)
			}
		}
	}
	return c, problems, lines
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// syntaxProblem places a yaml.v3 error at the line its message names.
func syntaxProblem(err error) Problem {
	msg := err.Error()
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return Problem{Line: n, Message: msg[len(m[0]):]}
	}
	return Problem{Message: strings.TrimPrefix(msg, "yaml: ")}
}

// walker compares a YAML node tree with the Go type it is decoded into.
type walker struct {
	problems []Problem
	lines    map[string]int
	// active holds the mappings being walked: a merge key (<<) that includes one of them
	// again would never end.
	active map[*yaml.Node]bool
	// visits counts the nodes walked: aliases can make a small document expand into a huge
	// one, which yaml.v3 refuses to decode and the walk must not expand either.
	visits int
	capped bool
}

// maxVisits bounds the walk; a configuration has a few hundred nodes.
const maxVisits = 100_000

func (w *walker) add(n *yaml.Node, path, format string, args ...any) {
	w.problems = append(w.problems, Problem{Line: n.Line, Path: path, Message: fmt.Sprintf(format, args...)})
}

var (
	durationType = reflect.TypeFor[Duration]()
	unmarshaler  = reflect.TypeFor[yaml.Unmarshaler]()
)

func (w *walker) walk(n *yaml.Node, t reflect.Type, path string) {
	if w.visits++; w.visits > maxVisits {
		if !w.capped {
			w.capped = true
			w.add(n, path, "the document expands (through aliases) to more than %d values", maxVisits)
		}
		return
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if _, ok := w.lines[path]; !ok {
		w.lines[path] = n.Line
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return // null leaves the default, like the decoder
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == durationType, reflect.PointerTo(t).Implements(unmarshaler), // decoded by its own UnmarshalYAML
		t.Kind() != reflect.Struct && t.Kind() != reflect.Slice && t.Kind() != reflect.Map,
		t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Struct:
		w.leaf(n, t, path)
	case t.Kind() == reflect.Struct:
		w.mapping(n, t, path)
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.add(n, path, "must be a list, got %s", describeNode(n))
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			w.add(n, path, "must be a mapping, got %s", describeNode(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			w.walk(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))
		}
	}
}

// leaf decodes one value into its type, reporting a yaml.v3 type error without its line
// prefix (the problem carries the line).
func (w *walker) leaf(n *yaml.Node, t reflect.Type, path string) {
	v := reflect.New(t)
	err := n.Decode(v.Interface())
	var te *yaml.TypeError
	if errors.As(err, &te) {
		for _, msg := range te.Errors {
			msg = yamlLineRE.ReplaceAllString(msg, "")
			msg = strings.TrimPrefix(msg, "cannot unmarshal ")
			w.add(n, path, "cannot use %s", friendlyTypes(msg))
		}
	} else if err != nil {
		w.add(n, path, "%v", err)
	}
}

// friendlyTypes names Go types the way a configuration's reader knows them.
func friendlyTypes(msg string) string {
	r := strings.NewReplacer(" into []string", " as a list of strings", " into int32", " as an integer (32 bits)",
		" into int64", " as an integer", " into int", " as an integer", " into float64", " as a number",
		" into bool", " as true or false", " into string", " as a string", " into a duration", " as a duration")
	return r.Replace(msg)
}

func (w *walker) mapping(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.MappingNode {
		w.add(n, path, "must be a mapping, got %s", describeNode(n))
		return
	}
	if w.active[n] {
		w.add(n, path, "a merge (<<) includes the mapping it is in")
		return
	}
	if w.active == nil {
		w.active = map[*yaml.Node]bool{}
	}
	w.active[n] = true
	defer delete(w.active, n)
	fields := yamlFields(t)
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value == "<<" && k.ShortTag() == "!!merge" {
			merged := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				merged = v.Content
			}
			for _, m := range merged {
				w.walk(m, t, path)
			}
			continue
		}
		p := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			w.add(k, p, "defined twice (first at line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		ft, ok := fields[k.Value]
		if !ok {
			if s := closest(k.Value, fields); s != "" {
				w.add(k, p, "unknown field (did you mean %s?)", s)
			} else {
				w.add(k, p, "unknown field")
			}
			continue
		}
		w.lines[p] = k.Line
		w.walk(v, ft, p)
	}
}

// yamlFields maps each yaml tag name of struct type t to its field's type.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields
}

// closest returns the known field nearest to name by edit distance, if it is near enough to
// be a typo (at most 2 edits, and fewer than half the name's letters), else a known field
// that starts with name.
func closest(name string, fields map[string]reflect.Type) string {
	best, bestD := "", 3
	names := make([]string, 0, len(fields))
	for f := range fields {
		names = append(names, f)
	}
	slices.Sort(names)
	for _, f := range names {
		if d := editDistance(name, f); d < bestD && d*2 < len(f) {
			best, bestD = f, d
		}
	}
	if best == "" && len(name) >= 3 {
		// A shortened name: max_body for max_body_bytes.
		for _, f := range names {
			if strings.HasPrefix(f, name) {
				return f
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes: field names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// lineOf finds the line of a validation error's path, or of its nearest parent the file
// writes (a missing field is placed at its section); 0 if the file writes none of it.
func lineOf(lines map[string]int, path string) int {
	for path != "" {
		if n, ok := lines[path]; ok {
			return n
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			return 0
		}
		path = path[:i]
	}
	return 0
}

// check decodes and validates data as [Load] does (the environment applied by apply between
// the two) and returns every problem as a [*FileError], or the configuration.
func check(file string, data []byte, apply func(*Config)) (*Config, error) {
	c, problems, lines := checkedDecode(data)
	if c == nil {
		return nil, &FileError{File: file, Problems: problems}
	}
	apply(c)
	var ve *ValidationError
	if err := c.Validate(); errors.As(err, &ve) {
		for _, fe := range ve.Errors {
			problems = append(problems, Problem{Line: lineOf(lines, fe.Path), Path: fe.Path, Message: fe.Message})
		}
	} else if err != nil {
		problems = append(problems, Problem{Message: err.Error()})
	}
	if len(problems) == 0 {
		return c, nil
	}
	// Line order, as an editor shows them; problems the file has no line for come last,
	// by path.
	slices.SortStableFunc(problems, func(a, b Problem) int {
		switch {
		case a.Line == b.Line:
			return comparePaths(a.Path, b.Path)
		case a.Line == 0:
			return 1
		case b.Line == 0:
			return -1
		}
		return a.Line - b.Line
	})
	return nil, &FileError{File: file, Problems: problems}
}
