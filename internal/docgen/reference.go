package docgen

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/oncegate/oncegate/internal/config"
)

// Command is the command that rewrites the page, named at its top.
const Command = "go test ./internal/docgen -update"

// Reference is the Markdown of docs/configuration.md, read from the module rooted at root.
func Reference(root string) ([]byte, error) {
	dir, err := readDir(root)
	if err != nil {
		return nil, err
	}
	src, err := parse(dir)
	if err != nil {
		return nil, err
	}
	secs, err := src.sections("Config")
	if err != nil {
		return nil, err
	}
	envs := probeEnv(src.consts)
	byPath := map[string]string{}
	for _, e := range envs {
		if len(e.sets) == 1 && len(e.with) == 0 {
			byPath[e.sets[0]] = e.value
		}
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "# Configuration reference\n\n")
	fmt.Fprintf(&b, "<!-- Generated from internal/config by `%s`; do not edit. -->\n\n", Command)
	b.WriteString("Generated from the configuration's Go structs (`internal/config`): every key, its type, its\n" +
		"default and its doc comment. The gateway reads a YAML file (`--config FILE`), then the\n" +
		"environment variables below, then the flags ([cli.md](cli.md)). Durations are Go duration strings\n" +
		"(`3s`, `150ms`); unknown keys are errors; a list given in the file replaces the default list.\n" +
		"`oncegate config check FILE` reports every problem of a file at once. Examples, each checked by a\n" +
		"test: [`testdata/config/`](../testdata/config/).\n\n")

	b.WriteString("## Environment variables\n\n")
	b.WriteString("An unset or empty variable changes nothing.\n\n")
	b.WriteString("| variable | sets | description |\n|---|---|---|\n")
	names := map[string]string{} // EnvX -> its variable, for the docs
	for _, c := range src.consts {
		names[c.name] = c.value
	}
	for _, e := range envs {
		sets := "—"
		if len(e.sets) > 0 {
			sets = "`" + strings.Join(e.sets, "`, `") + "`"
			if len(e.with) > 0 {
				sets += " (with `" + strings.Join(e.with, "`, `") + "`)"
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", e.value, sets, cell(yamlNames(e.doc, names)))
	}
	b.WriteString("\n")

	for _, s := range secs {
		title := "Top level"
		if s.Path != "" {
			title = "`" + s.Path + "`"
		}
		fmt.Fprintf(&b, "## %s\n\n", title)
		if s.Doc != "" {
			fmt.Fprintf(&b, "%s\n\n", s.Doc)
		}
		if s.Path == "backends[]" {
			b.WriteString("Defaults: what an entry starts from when the file leaves the key out.\n\n")
		}
		b.WriteString("| key | type | default | env | description |\n|---|---|---|---|---|\n")
		for _, f := range s.Fields {
			env := ""
			if v, ok := byPath[f.Path]; ok {
				env = "`" + v + "`"
			}
			def := defaultOf(f.Path)
			if f.Type == "mapping" {
				def = "—" // its keys' defaults are in its own section
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", f.Path, f.Type, cell(def), env, cell(f.Doc))
		}
		b.WriteString("\n")
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// cell makes text safe inside a Markdown table cell.
func cell(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}

// defaultOf renders the default of a path: the top level from config.Default, a backend
// entry from config.BackendDefaults, any other list or map entry from its zero value.
func defaultOf(path string) string {
	v := reflect.ValueOf(*config.Default())
	segs := strings.Split(path, ".")
	for i := 0; i < len(segs); i++ {
		seg := segs[i]
		elem := strings.HasSuffix(seg, "[]")
		f, ok := fieldByYAML(v, strings.TrimSuffix(seg, "[]"))
		if !ok {
			return "?"
		}
		v = f
		switch {
		case elem && i == 0 && seg == "backends[]":
			v = reflect.ValueOf(config.BackendDefaults())
		case elem:
			v = reflect.Zero(v.Type().Elem())
		case v.Kind() == reflect.Map && i+1 < len(segs) && segs[i+1] == "<name>":
			v = reflect.Zero(v.Type().Elem())
			i++
		}
		if v.Kind() == reflect.Pointer && i+1 < len(segs) {
			if v.IsNil() {
				v = reflect.Zero(v.Type().Elem())
			} else {
				v = v.Elem()
			}
		}
	}
	return "`" + flow(v) + "`"
}

// fieldByYAML is the field of struct v whose YAML key is name.
func fieldByYAML(v reflect.Value, name string) (reflect.Value, bool) {
	if v.Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	t := v.Type()
	for i := range t.NumField() {
		if n, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); n == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

var durationType = reflect.TypeFor[config.Duration]()

// flow writes v as YAML flow style, leaving out a struct's zero fields.
func flow(v reflect.Value) string {
	if v.Type() == durationType {
		return shortDuration(time.Duration(v.Int()))
	}
	if t, ok := v.Interface().(config.Timestamp); ok {
		if t.IsZero() {
			return `""`
		}
		return t.Format(time.RFC3339)
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return "null"
		}
		return flow(v.Elem())
	case reflect.String:
		if v.String() == "" {
			return `""`
		}
		return v.String()
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.Int, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	case reflect.Float64:
		return strconv.FormatFloat(v.Float(), 'g', -1, 64)
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = flow(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Map:
		keys := make([]string, 0, v.Len())
		for _, k := range v.MapKeys() {
			keys = append(keys, k.String())
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ": " + flow(v.MapIndex(reflect.ValueOf(k)))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case reflect.Struct:
		var parts []string
		t := v.Type()
		for i := range t.NumField() {
			n, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			if n == "" || n == "-" || v.Field(i).IsZero() {
				continue
			}
			parts = append(parts, n+": "+flow(v.Field(i)))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v.Interface())
}

// shortDuration is d as Go writes it, without zero trailing units ("24h", "1m", "1m30s").
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// envEffect is what an environment variable does to a default configuration.
type envEffect struct {
	envConst
	sets []string // the YAML paths it changes
	with []string // the other variables it needs to change anything
}

// probeEnv applies each variable (alone, else with each other variable that does nothing
// alone) to config.Default and records which keys change.
func probeEnv(consts []envConst) []envEffect {
	apply := func(vars ...string) []string {
		c := config.Default()
		c.ApplyEnv(func(k string) string {
			if slices.Contains(vars, k) {
				return "probe"
			}
			return ""
		})
		return diff(reflect.ValueOf(*config.Default()), reflect.ValueOf(*c), "")
	}
	out := make([]envEffect, len(consts))
	for i, c := range consts {
		out[i] = envEffect{envConst: c, sets: apply(c.value)}
	}
	for i := range out {
		if len(out[i].sets) > 0 {
			continue
		}
		for j := range out {
			if i == j || len(apply(out[j].value)) > 0 {
				continue
			}
			if sets := apply(out[i].value, out[j].value); len(sets) > 0 {
				out[i].sets, out[i].with = sets, append(out[i].with, out[j].value)
			}
		}
	}
	return out
}

// diff lists the YAML paths where a and b (the same struct type) differ; a list or map that
// differs is one path.
func diff(a, b reflect.Value, path string) []string {
	if a.Kind() != reflect.Struct || a.Type() == durationType {
		if reflect.DeepEqual(a.Interface(), b.Interface()) {
			return nil
		}
		return []string{path}
	}
	var out []string
	t := a.Type()
	for i := range t.NumField() {
		n, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if n == "" || n == "-" {
			continue
		}
		out = append(out, diff(a.Field(i), b.Field(i), join(path, n))...)
	}
	return out
}
