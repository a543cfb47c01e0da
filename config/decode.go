package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Error is one problem found in a configuration file: where it is (file,
// line, path of the key) and what was expected.
type Error struct {
	File string
	Line int
	Path string
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Path != "" {
		b.WriteString(": ")
		b.WriteString(e.Path)
	}
	b.WriteString(": ")
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one file, in file order.
type Errors []*Error

func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap lets errors.As find the individual errors.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// decoder turns a yaml.Node tree into Go values strictly: every key must be a
// field of the target, every value must have the field's type. It collects all
// problems instead of stopping at the first.
type decoder struct {
	file string
	errs Errors
	// driver is the driver of the provider being decoded; fields tagged
	// `drivers:"a,b"` are keys only for those drivers.
	driver string
}

func (d *decoder) fail(path string, n *yaml.Node, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// customDecoder is implemented by types that decode themselves (durations,
// values that may be a string or a list, driver-dependent mappings).
type customDecoder interface {
	decodeYAML(d *decoder, path string, n *yaml.Node)
}

var customDecoderType = reflect.TypeFor[customDecoder]()

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func indexPath(path string, i int) string {
	return fmt.Sprintf("%s[%d]", path, i)
}

// describe names what a node holds, for "expected X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return describe(n.Alias)
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return "nothing"
		case "!!str":
			return strconv.Quote(n.Value)
		case "!!int":
			return "the integer " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		}
		return n.Value
	}
	return "an unexpected value"
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// decode stores n into v (which must be settable).
func (d *decoder) decode(path string, n *yaml.Node, v reflect.Value) {
	n = resolveAlias(n)
	if isNull(n) {
		return // an empty value leaves the default in place
	}
	if v.CanAddr() && v.Addr().Type().Implements(customDecoderType) {
		v.Addr().Interface().(customDecoder).decodeYAML(d, path, n)
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.decode(path, n, v.Elem())
	case reflect.Struct:
		d.decodeStruct(path, n, []reflect.Value{v})
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			d.fail(path, n, "expected a list, got %s", describe(n))
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.decode(indexPath(path, i), item, s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			d.fail(path, n, "expected a mapping, got %s", describe(n))
			return
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			ev := reflect.New(v.Type().Elem()).Elem()
			d.decode(joinPath(path, k.Value), val, ev)
			m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), ev)
		}
		v.Set(m)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.fail(path, n, "expected a string, got %s", describe(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Int, reflect.Int64, reflect.Int32:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			d.fail(path, n, "expected an integer, got %s", describe(n))
			return
		}
		i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
		if err != nil {
			d.fail(path, n, "expected an integer, got %s", describe(n))
			return
		}
		v.SetInt(i)
	case reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			d.fail(path, n, "expected a number, got %s", describe(n))
			return
		}
		f, err := strconv.ParseFloat(n.Value, 64)
		if err != nil {
			d.fail(path, n, "expected a number, got %s", describe(n))
			return
		}
		v.SetFloat(f)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			d.fail(path, n, "expected true or false, got %s", describe(n))
			return
		}
		v.SetBool(n.Value == "true" || n.Value == "True" || n.Value == "TRUE" || n.Value == "yes")
	default:
		d.fail(path, n, "cannot decode into %s (a bug in the schema)", v.Type())
	}
}

// decodeStruct decodes a mapping into one or more structs: a key is stored in
// the first target that has a field for it. Several targets let a mapping mix
// common keys with keys that depend on the driver.
func (d *decoder) decodeStruct(path string, n *yaml.Node, targets []reflect.Value) {
	n = resolveAlias(n)
	if n.Kind != yaml.MappingNode {
		d.fail(path, n, "expected a mapping, got %s", describe(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := k.Value
		if seen[key] {
			d.fail(joinPath(path, key), k, "key given twice")
			continue
		}
		seen[key] = true
		field, ok := d.findField(targets, key)
		if !ok {
			d.fail(joinPath(path, key), k, "unknown key; expected one of: %s", strings.Join(d.fieldNames(targets), ", "))
			continue
		}
		d.decode(joinPath(path, key), val, field)
	}
	for _, t := range targets {
		for _, f := range reflect.VisibleFields(t.Type()) {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" || f.Tag.Get("required") != "true" || !d.fieldApplies(f) {
				continue
			}
			if !seen[name] {
				d.fail(path, n, "missing required key %q", name)
			}
		}
	}
}

// fieldApplies reports whether a field is a key for the current driver:
// `drivers:"a,b"` names the only drivers that have it, `notdrivers:"c"` the
// drivers that do not.
func (d *decoder) fieldApplies(f reflect.StructField) bool {
	if not := f.Tag.Get("notdrivers"); not != "" && slices.Contains(strings.Split(not, ","), d.driver) {
		return false
	}
	drivers := f.Tag.Get("drivers")
	if drivers == "" {
		return true
	}
	return slices.Contains(strings.Split(drivers, ","), d.driver)
}

func (d *decoder) findField(targets []reflect.Value, key string) (reflect.Value, bool) {
	for _, t := range targets {
		for _, f := range reflect.VisibleFields(t.Type()) {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == key && d.fieldApplies(f) {
				return t.FieldByIndex(f.Index), true
			}
		}
	}
	return reflect.Value{}, false
}

func (d *decoder) fieldNames(targets []reflect.Value) []string {
	var names []string
	for _, t := range targets {
		for _, f := range reflect.VisibleFields(t.Type()) {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name != "" && name != "-" && d.fieldApplies(f) {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// mappingValue returns the value node of key in a mapping node, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	n = resolveAlias(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return resolveAlias(n.Content[i+1])
		}
	}
	return nil
}

// Duration is a length of time written as a number of seconds (Nodepool's
// habit: `boot-timeout: 120`, `boot-delay: 0.1`) or as a Go duration string
// (`90s`, `5m`, `1h30m`).
type Duration time.Duration

// D returns the duration as a time.Duration.
func (du Duration) D() time.Duration { return time.Duration(du) }

func (du *Duration) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind != yaml.ScalarNode {
		d.fail(path, n, "expected a duration (seconds, or a string such as \"90s\" or \"5m\"), got %s", describe(n))
		return
	}
	val, err := parseDuration(n.Value)
	if err != nil {
		d.fail(path, n, "expected a duration (seconds, or a string such as \"90s\" or \"5m\"), got %s", describe(n))
		return
	}
	if val < 0 {
		d.fail(path, n, "expected a duration of zero or more, got %s", describe(n))
		return
	}
	*du = Duration(val)
}

func parseDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("not a duration")
	}
	return d, nil
}

// MarshalText writes the duration as a Go duration string.
func (du Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(du).String()), nil }

// StringList is a list of strings that may also be written as one string.
type StringList []string

func (sl *StringList) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		*sl = StringList{n.Value}
		return
	}
	var list []string
	d.decode(path, n, reflect.ValueOf(&list).Elem())
	*sl = list
}
