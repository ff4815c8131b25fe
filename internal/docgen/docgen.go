// Package docgen writes the configuration reference, docs/configuration.md, from the
// configuration itself, so that the page cannot drift from the code: the fields, their YAML
// names, types and doc comments are read from internal/config's source (go/ast), the defaults
// from [config.Default] and [config.BackendDefaults], and the environment variables by
// applying each one to a default configuration and seeing which field it changes.
//
// A field without a doc comment (on the field, at the end of its line, or, for a nested
// section, on its type) is an error: [Reference] refuses to write a page with an undocumented
// field. The golden test (go test ./internal/docgen -update) rewrites the page. Nothing here
// runs in the gateway; the package has no state.
package docgen

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ErrUndocumented is returned (wrapped, with the fields' paths) when a configuration field
// has no doc comment.
var ErrUndocumented = errors.New("docgen: configuration fields without a doc comment")

// Field is one configuration key.
type Field struct {
	Path string // YAML path: "nats.cluster.routes", "backends[].breaker.window"
	Type string // as a reader writes it: "duration", "list of strings", "mapping"
	Doc  string // the field's doc comment (or, for a section, its type's), one paragraph
}

// Section is a mapping of the configuration: the top level, or a key whose value is a
// mapping (or a list or map of them).
type Section struct {
	Path   string // "" for the top level; "backends[]" for each entry of backends
	Doc    string // the Go type's doc comment
	Fields []Field
}

// typeInfo is a named type of the package.
type typeInfo struct {
	doc string
	st  *ast.StructType // nil for a non-struct type
}

// source is what the package's files declare.
type source struct {
	types  map[string]typeInfo
	consts []envConst        // the Env* string constants, in source order
	strs   map[string]string // every string constant: name -> value
}

// envConst is an environment variable's name constant.
type envConst struct{ name, value, doc string }

// parse reads the non-test Go files of dir.
func parse(dir string) (*source, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, fmt.Errorf("docgen: %w", err)
	}
	src := &source{types: map[string]typeInfo{}, strs: map[string]string{}}
	fset := token.NewFileSet()
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("docgen: %w", err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, s := range gd.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					doc := s.Doc.Text()
					if doc == "" {
						doc = gd.Doc.Text()
					}
					st, _ := s.Type.(*ast.StructType)
					src.types[s.Name.Name] = typeInfo{doc: paragraph(doc), st: st}
				case *ast.ValueSpec:
					if gd.Tok != token.CONST {
						continue
					}
					for i, n := range s.Names {
						if i >= len(s.Values) {
							continue
						}
						lit, ok := s.Values[i].(*ast.BasicLit)
						if !ok || lit.Kind != token.STRING {
							continue
						}
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							return nil, fmt.Errorf("docgen: %s: %w", n.Name, err)
						}
						src.strs[n.Name] = v
						if !strings.HasPrefix(n.Name, "Env") {
							continue
						}
						src.consts = append(src.consts, envConst{name: n.Name, value: v, doc: paragraph(s.Doc.Text() + s.Comment.Text())})
					}
				}
			}
		}
	}
	return src, nil
}

// Sections walks the struct type root of the package in dir and returns its sections in
// reading order (a section before the sections nested in it). Undocumented fields are
// returned with an error that matches [ErrUndocumented] and names each one.
func Sections(dir, root string) ([]Section, error) {
	src, err := parse(dir)
	if err != nil {
		return nil, err
	}
	return src.sections(root)
}

func (src *source) sections(root string) ([]Section, error) {
	if ti, ok := src.types[root]; !ok || ti.st == nil {
		return nil, fmt.Errorf("docgen: no struct type %s", root)
	}
	var (
		out     []Section
		missing []string
	)
	var walk func(typeName, path string)
	walk = func(typeName, path string) {
		ti := src.types[typeName]
		i := len(out)
		out = append(out, Section{Path: path, Doc: ti.doc})
		var nested [][2]string       // type, path
		names := map[string]string{} // Go field name -> YAML key, for the docs
		for _, f := range ti.st.Fields.List {
			if n := yamlName(f); n != "" && strings.ToUpper(f.Names[0].Name) != f.Names[0].Name {
				names[f.Names[0].Name] = n
			}
		}
		out[i].Doc = src.values(yamlNames(leading(ti.doc, typeName, subject(path)), names))
		for _, f := range ti.st.Fields.List {
			name := yamlName(f)
			if name == "" {
				continue
			}
			p := join(path, name)
			elem, shape := elemType(f.Type)
			doc := src.values(yamlNames(paragraph(f.Doc.Text()+"\n"+f.Comment.Text()), names))
			if _, ok := src.types[elem]; ok && src.hasYAMLFields(elem) {
				sp := p
				switch shape {
				case "list":
					sp += "[]"
				case "map":
					sp += ".<name>"
				}
				if doc == "" {
					doc = src.values(leading(src.types[elem].doc, elem, subject(sp)))
				}
				nested = append(nested, [2]string{elem, sp})
			}
			if doc == "" {
				missing = append(missing, p)
			}
			out[i].Fields = append(out[i].Fields, Field{Path: p, Type: src.typeName(f.Type), Doc: doc})
		}
		for _, n := range nested {
			walk(n[0], n[1])
		}
	}
	walk(root, "")
	if len(missing) > 0 {
		return out, fmt.Errorf("%w: %s", ErrUndocumented, strings.Join(missing, ", "))
	}
	return out, nil
}

// hasYAMLFields says whether a type is a struct with YAML keys of its own (a section), as
// opposed to a scalar with its own YAML form (Timestamp).
func (src *source) hasYAMLFields(name string) bool {
	ti := src.types[name]
	if ti.st == nil {
		return false
	}
	return slices.ContainsFunc(ti.st.Fields.List, func(f *ast.Field) bool { return yamlName(f) != "" })
}

// yamlName is a field's YAML key, or "" for a field YAML does not see.
func yamlName(f *ast.Field) string {
	if f.Tag == nil || len(f.Names) == 0 {
		return ""
	}
	tag, err := strconv.Unquote(f.Tag.Value)
	if err != nil {
		return ""
	}
	name, _, _ := strings.Cut(reflect.StructTag(tag).Get("yaml"), ",")
	if name == "-" {
		return ""
	}
	return name
}

// elemType is the named type a field holds, directly, through a pointer, or as the element
// of a list or map, and which of those ("", "list", "map").
func elemType(e ast.Expr) (string, string) {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name, ""
	case *ast.StarExpr:
		return elemType(t.X)
	case *ast.ArrayType:
		n, _ := elemType(t.Elt)
		return n, "list"
	case *ast.MapType:
		n, _ := elemType(t.Value)
		return n, "map"
	}
	return "", ""
}

// typeName is how the reference names a field's type.
func (src *source) typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return src.typeName(t.X)
	case *ast.ArrayType:
		return "list of " + plural(src.typeName(t.Elt))
	case *ast.MapType:
		return "map of " + plural(src.typeName(t.Value)) + " by name"
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.Ident:
		switch t.Name {
		case "string":
			return "string"
		case "bool":
			return "bool"
		case "int", "int32", "int64":
			return "integer"
		case "float64":
			return "number"
		case "Duration":
			return "duration"
		case "Timestamp":
			return "time (RFC 3339)"
		}
		if src.hasYAMLFields(t.Name) {
			return "mapping"
		}
		return t.Name
	}
	return "value"
}

func plural(s string) string {
	switch s {
	case "integer", "number", "string", "mapping", "duration", "bool":
		return s + "s"
	}
	return s
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// yamlNames writes the Go names of names (a field's, or a type's) as their YAML keys.
func yamlNames(doc string, names map[string]string) string {
	for goName, key := range names {
		re := regexp.MustCompile(`\b` + regexp.QuoteMeta(goName) + `\b`)
		doc = re.ReplaceAllString(doc, "`"+key+"`")
	}
	return doc
}

// values writes the names of the package's string constants in doc as their values.
func (src *source) values(doc string) string {
	for name, v := range src.strs {
		doc = regexp.MustCompile(`\b`+regexp.QuoteMeta(name)+`\b`).ReplaceAllString(doc, "`"+v+"`")
	}
	return doc
}

// leading writes a doc comment's first word, the Go name goName, as subject.
func leading(doc, goName, subject string) string {
	if rest, ok := strings.CutPrefix(doc, goName+" "); ok {
		return subject + " " + rest
	}
	return doc
}

// subject is how a section's doc names it: "The configuration", "`nats`", "An entry of
// `backends`", "A value of `ledger.prices`".
func subject(path string) string {
	switch {
	case path == "":
		return "The configuration"
	case strings.HasSuffix(path, "[]"):
		return "An entry of `" + strings.TrimSuffix(path, "[]") + "`"
	case strings.HasSuffix(path, ".<name>"):
		return "A value of `" + strings.TrimSuffix(path, ".<name>") + "`"
	}
	return "`" + path + "`"
}

// paragraph joins a doc comment's lines into one, drops #nosec annotations and Go doc link
// brackets.
func paragraph(doc string) string {
	var words []string
	for _, l := range strings.Split(doc, "\n") {
		l, _, _ = strings.Cut(l, "#nosec")
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		words = append(words, l)
	}
	return strings.Join(words, " ")
}

// readDir is the directory of the package source, relative to the module root.
func readDir(root string) (string, error) {
	dir := filepath.Join(root, "internal", "config")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("docgen: %w", err)
	}
	return dir, nil
}
