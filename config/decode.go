package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Error is one problem found in a configuration file: where it is (file,
// line, path of the key) and what was expected. Warnings have the same
// shape.
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

// maxNodes bounds the YAML nodes one file may expand to through aliases,
// so that a hostile file (the "billion laughs") is refused instead of
// exhausting memory.
const maxNodes = 1 << 18

// decoder turns a yaml.Node tree into Go values strictly: every key must be a
// field of the target, every value must have the field's type. It collects all
// problems instead of stopping at the first.
type decoder struct {
	file  string
	errs  Errors
	warns Errors
	// driver is the driver of the provider being decoded; fields tagged
	// `drivers:"a,b"` are keys only for those drivers.
	driver string
	// lenient skips unknown keys without a word: set while decoding a
	// provider whose driver is not available, whose keys cannot be known.
	lenient bool
	// nodes counts the nodes decoded, aliases expanded (see maxNodes).
	nodes    int
	tooLarge bool
	// merging are the mappings whose merge keys are being expanded, to
	// refuse a mapping that merges itself.
	merging map[*yaml.Node]bool
	// apart counts the errors that stand apart: a provider of a driver
	// this build does not know. The rest of the file is still checked
	// past them (see blocked).
	apart int
	// env is the environment (KEY=value) the file is read in: the
	// %(NODEPOOL_...) placeholders' and OS_CLOUD's.
	env []string
}

// blocked reports whether an error found so far stops the next phase
// (references, defaults and checks need what the earlier phase decoded).
func (d *decoder) blocked() bool { return len(d.errs) > d.apart }

// failApart records an error that does not keep the rest of the file from
// being checked.
func (d *decoder) failApart(path string, n *yaml.Node, format string, args ...any) {
	d.fail(path, n, format, args...)
	d.apart++
}

// getenv returns a variable of the environment the file is read in.
func (d *decoder) getenv(name string) string {
	for _, kv := range d.env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}

func (d *decoder) fail(path string, n *yaml.Node, format string, args ...any) {
	d.errs = append(d.errs, d.problem(path, n, format, args...))
}

func (d *decoder) warn(path string, n *yaml.Node, format string, args ...any) {
	d.warns = append(d.warns, d.problem(path, n, format, args...))
}

func (d *decoder) problem(path string, n *yaml.Node, format string, args ...any) *Error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &Error{File: d.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)}
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
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	if n != nil && n.Kind == yaml.AliasNode {
		return nil // an alias loop; yaml.v3 refuses those, this is a guard
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n != nil && n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// count charges n to the node budget; false once it is spent.
func (d *decoder) count() bool {
	d.nodes++
	if d.nodes > maxNodes {
		if !d.tooLarge {
			d.tooLarge = true
			d.fail("", nil, "the file expands to more than %d values through aliases; expected a configuration, not a puzzle", maxNodes)
		}
		return false
	}
	return true
}

// decode stores n into v (which must be settable).
func (d *decoder) decode(path string, n *yaml.Node, v reflect.Value) {
	if !d.count() {
		return
	}
	n = resolveAlias(n)
	if n == nil || isNull(n) {
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
		d.decodeStruct(path, n, v)
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
		ps := d.pairs(path, n)
		m := reflect.MakeMapWithSize(v.Type(), len(ps))
		for _, p := range ps {
			if p.key.Kind != yaml.ScalarNode {
				d.fail(path, p.key, "expected a plain key, got %s", describe(p.key))
				continue
			}
			ev := reflect.New(v.Type().Elem()).Elem()
			d.decode(joinPath(path, p.key.Value), p.val, ev)
			m.SetMapIndex(reflect.ValueOf(p.key.Value).Convert(v.Type().Key()), ev)
		}
		v.Set(m)
	case reflect.String:
		d.decodeString(path, n, v, false)
	case reflect.Int, reflect.Int64, reflect.Int32:
		i, ok := d.integer(path, n)
		if ok {
			v.SetInt(i)
		}
	case reflect.Float64:
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
			d.fail(path, n, "expected a number, got %s", describe(n))
			return
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil {
			d.fail(path, n, "expected a number, got %s", describe(n))
			return
		}
		v.SetFloat(f)
	case reflect.Bool:
		b, ok := yamlBool(n)
		if !ok {
			d.fail(path, n, "expected true or false, got %s", describe(n))
			return
		}
		v.SetBool(b)
	default:
		d.fail(path, n, "cannot decode into %s (a bug in the schema)", v.Type())
	}
}

// decodeString stores a string. Nodepool reads its file with PyYAML, whose
// unquoted 8, 1.5 and true are a number and a boolean, which a key typed
// str refuses; so do we, unless anyScalar (release: 8 is fine).
func (d *decoder) decodeString(path string, n *yaml.Node, v reflect.Value, anyScalar bool) {
	if n.Kind != yaml.ScalarNode {
		d.fail(path, n, "expected a string, got %s", describe(n))
		return
	}
	if !anyScalar && (n.Tag == "!!int" || n.Tag == "!!float" || n.Tag == "!!bool") {
		d.fail(path, n, "expected a string, got %s; quote it (%q) to make it one", describe(n), n.Value)
		return
	}
	v.SetString(n.Value)
}

func (d *decoder) integer(path string, n *yaml.Node) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		d.fail(path, n, "expected an integer, got %s", describe(n))
		return 0, false
	}
	i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, 64)
	if err != nil {
		if u, uerr := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, 64); uerr == nil && u > 0 {
			d.fail(path, n, "the integer %s is too large", n.Value)
		} else {
			d.fail(path, n, "expected an integer, got %s", describe(n))
		}
		return 0, false
	}
	return i, true
}

// yamlBool reads a boolean the way PyYAML (YAML 1.1) does: besides true
// and false in any case, yes/no and on/off.
func yamlBool(n *yaml.Node) (bool, bool) {
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!bool" && n.Tag != "!!str") || n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0 {
		return false, false
	}
	switch n.Value {
	case "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON":
		return true, true
	case "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF":
		return false, true
	}
	return false, false
}

// pair is one key and value of a mapping.
type pair struct{ key, val *yaml.Node }

// pairs lists a mapping's entries with YAML merge keys (`<<: *anchor`)
// expanded, as PyYAML does: an entry written in the mapping wins over a
// merged one, and of several merged mappings the first wins. A key given
// twice keeps its last value (PyYAML's rule) with a warning.
func (d *decoder) pairs(path string, n *yaml.Node) []pair {
	if d.merging[n] {
		d.fail(joinPath(path, "<<"), n, "a mapping merges itself (through an alias of an anchor it holds)")
		return nil
	}
	if d.merging == nil {
		d.merging = map[*yaml.Node]bool{}
	}
	d.merging[n] = true
	defer delete(d.merging, n)
	var own, merged []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			merged = append(merged, d.mergeSources(path, k, v)...)
			continue
		}
		own = append(own, pair{k, v})
	}
	out := make([]pair, 0, len(own)+len(merged))
	index := map[string]int{}
	for _, p := range own {
		name := p.key.Value
		if i, dup := index[name]; dup && p.key.Kind == yaml.ScalarNode {
			d.warn(joinPath(path, name), p.key, "key given twice (also line %d); the last value is used, as Nodepool does", out[i].key.Line)
			out[i] = p
			continue
		}
		index[name] = len(out)
		out = append(out, p)
	}
	for _, p := range merged {
		if _, ok := index[p.key.Value]; ok {
			continue
		}
		index[p.key.Value] = len(out)
		out = append(out, p)
	}
	return out
}

// mergeSources returns the entries a merge key brings in.
func (d *decoder) mergeSources(path string, k, v *yaml.Node) []pair {
	v = resolveAlias(v)
	var srcs []*yaml.Node
	switch {
	case v != nil && v.Kind == yaml.MappingNode:
		srcs = []*yaml.Node{v}
	case v != nil && v.Kind == yaml.SequenceNode:
		for _, s := range v.Content {
			srcs = append(srcs, resolveAlias(s))
		}
	}
	var out []pair
	for _, s := range srcs {
		if s == nil || s.Kind != yaml.MappingNode {
			d.fail(joinPath(path, "<<"), k, "a merge key takes a mapping or a list of mappings")
			return nil
		}
		if !d.count() {
			return nil
		}
		out = append(out, d.pairs(path, s)...)
	}
	if srcs == nil {
		d.fail(joinPath(path, "<<"), k, "a merge key takes a mapping or a list of mappings, got %s", describe(v))
	}
	return out
}

// field is a key of a struct: its name in the file and where it is,
// through inline (embedded) structs.
type field struct {
	name  string
	index []int
	tag   reflect.StructTag
}

// fieldsOf lists the keys of a struct type, in declaration order, walking
// into anonymous fields tagged `yaml:",inline"` (the driver-specific parts
// of Provider, Pool and PoolLabel). Unlike reflect.VisibleFields it keeps
// fields whose Go names clash across inline structs: two drivers may both
// have a key, with its own type each.
func fieldsOf(t reflect.Type) []field {
	var out []field
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			idx := append(slices.Clone(index), i)
			if f.Anonymous && name == "" && opts == "inline" && f.Type.Kind() == reflect.Struct {
				walk(f.Type, idx)
				continue
			}
			if name == "" || name == "-" || !f.IsExported() {
				continue
			}
			out = append(out, field{name: name, index: idx, tag: f.Tag})
		}
	}
	walk(t, nil)
	return out
}

// decodeStruct decodes a mapping into a struct: a key is stored in the
// first field of that name whose drivers tag applies. It returns the keys
// the mapping gives a value (not null), for defaults that depend on
// whether a key was written.
func (d *decoder) decodeStruct(path string, n *yaml.Node, v reflect.Value) map[string]bool {
	set := map[string]bool{}
	n = resolveAlias(n)
	if n == nil {
		return set
	}
	if n.Kind != yaml.MappingNode {
		d.fail(path, n, "expected a mapping, got %s", describe(n))
		return set
	}
	fields := fieldsOf(v.Type())
	seen := map[string]bool{}
	for _, p := range d.pairs(path, n) {
		if p.key.Kind != yaml.ScalarNode {
			d.fail(path, p.key, "expected a plain key, got %s", describe(p.key))
			continue
		}
		key := p.key.Value
		seen[key] = true
		f, ok := d.findField(fields, key)
		if !ok {
			if !d.lenient && !d.tolerated(path, n, p, v, set) {
				d.unknownKey(joinPath(path, key), p.key, key, v.Type())
			}
			continue
		}
		if !isNull(resolveAlias(p.val)) {
			set[key] = true
		}
		fv := v.FieldByIndex(f.index)
		if rv := resolveAlias(p.val); f.tag.Get("orlist") != "" && rv != nil && rv.Kind == yaml.SequenceNode && fv.Kind() == reflect.String {
			d.firstOfList(joinPath(path, key), rv, fv, f.tag.Get("orlist"))
			continue
		}
		if f.tag.Get("anyscalar") == "true" && fv.Kind() == reflect.String {
			if rv := resolveAlias(p.val); rv != nil && !isNull(rv) {
				d.decodeString(joinPath(path, key), rv, fv, true)
			}
			continue
		}
		d.decode(joinPath(path, key), p.val, fv)
	}
	for _, f := range fields {
		if f.tag.Get("required") != "true" || !d.fieldApplies(f.tag) || seen[f.name] {
			continue
		}
		d.fail(path, n, "missing required key %q", f.name)
	}
	return set
}

// firstOfList reads a list given for a string key whose field has an
// orlist tag (the warning): its first entry is the value.
func (d *decoder) firstOfList(path string, n *yaml.Node, fv reflect.Value, why string) {
	if len(n.Content) == 0 {
		d.fail(path, n, "expected a value (or a list of at least one), got an empty list")
		return
	}
	d.decodeString(indexPath(path, 0), resolveAlias(n.Content[0]), fv, false)
	if len(n.Content) > 1 || fv.String() != "" {
		d.warn(path, n, "a list here is read as its first entry, %q: %s", fv.String(), why)
	}
}

// fieldApplies reports whether a field is a key for the current driver:
// `drivers:"a,b"` names the only drivers that have it, `notdrivers:"c"` the
// drivers that do not.
func (d *decoder) fieldApplies(tag reflect.StructTag) bool {
	if not := tag.Get("notdrivers"); not != "" && slices.Contains(strings.Split(not, ","), d.driver) {
		return false
	}
	drivers := tag.Get("drivers")
	if drivers == "" {
		return true
	}
	return slices.Contains(strings.Split(drivers, ","), d.driver)
}

func (d *decoder) findField(fields []field, key string) (field, bool) {
	for _, f := range fields {
		if f.name == key && d.fieldApplies(f.tag) {
			return f, true
		}
	}
	return field{}, false
}

func (d *decoder) fieldNames(fields []field) []string {
	var names []string
	for _, f := range fields {
		if d.fieldApplies(f.tag) {
			names = append(names, f.name)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// mappingValue returns the value node of key in a mapping node (merge keys
// expanded), or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	n = resolveAlias(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	var quiet decoder
	var found *yaml.Node
	for _, p := range quiet.pairs("", n) {
		if p.key.Value == key {
			found = resolveAlias(p.val)
		}
	}
	return found
}

// keyNode returns the key node of key in a mapping, for pointing at the
// line of a key whose value is empty.
func keyNode(n *yaml.Node, key string) *yaml.Node {
	n = resolveAlias(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i]
		}
	}
	return nil
}

// Duration is a length of time written as a number of seconds (Nodepool's
// habit: `boot-timeout: 120`) or, as an extension, as a fraction of seconds
// (`boot-delay: 0.1`) or a Go duration string (`90s`, `5m`, `1h30m`).
type Duration time.Duration

// D returns the duration as a time.Duration.
func (du Duration) D() time.Duration { return time.Duration(du) }

const durationExpected = "a duration (seconds, or a string such as \"90s\" or \"5m\")"

func (du *Duration) decodeYAML(d *decoder, path string, n *yaml.Node) {
	val, ok := d.duration(path, n)
	if !ok {
		return
	}
	if val < 0 {
		d.fail(path, n, "expected a duration of zero or more, got %s", describe(n))
		return
	}
	*du = Duration(val)
}

func (d *decoder) duration(path string, n *yaml.Node) (time.Duration, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!bool" {
		d.fail(path, n, "expected %s, got %s", durationExpected, describe(n))
		return 0, false
	}
	val, err := parseDuration(n.Value)
	if err != nil {
		d.fail(path, n, "expected %s, got %s", durationExpected, describe(n))
		return 0, false
	}
	return val, true
}

// Age is a Duration where zero or less means "off" (max-hold-age,
// max-ready-age): a negative number is accepted, as Nodepool does, and
// read as zero.
type Age Duration

// D returns the age as a time.Duration (0: off).
func (a Age) D() time.Duration { return time.Duration(a) }

func (a *Age) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if val, ok := d.duration(path, n); ok {
		*a = Age(max(val, 0))
	}
}

// MarshalText writes the age as a Go duration string.
func (a Age) MarshalText() ([]byte, error) { return []byte(time.Duration(a).String()), nil }

// UnmarshalText reads what MarshalText wrote (or seconds).
func (a *Age) UnmarshalText(b []byte) error {
	d, err := parseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q: %w", b, err)
	}
	*a = Age(d)
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f > float64(1<<62)/float64(time.Second) || f < -float64(1<<62)/float64(time.Second) {
			return 0, errors.New("out of range")
		}
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

// UnmarshalText reads what MarshalText wrote (or seconds): a provider's
// section is remembered as JSON (see ProviderSection).
func (du *Duration) UnmarshalText(b []byte) error {
	d, err := parseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q: %w", b, err)
	}
	*du = Duration(d)
	return nil
}

// StringList is a list of strings that may also be written as one string.
type StringList []string

func (sl *StringList) decodeYAML(d *decoder, path string, n *yaml.Node) {
	if n.Kind == yaml.ScalarNode {
		var s string
		d.decodeString(path, n, reflect.ValueOf(&s).Elem(), false)
		*sl = StringList{s}
		return
	}
	var list []string
	d.decode(path, n, reflect.ValueOf(&list).Elem())
	*sl = list
}

// Attributes is a mapping of names to scalar values (node-attributes,
// diskimage metadata): numbers and booleans are kept as the text written,
// since the node record's attributes are strings.
type Attributes map[string]string

func (a *Attributes) decodeYAML(d *decoder, path string, n *yaml.Node) {
	out := Attributes{}
	d.scalarPairs(path, n, "expected a plain value (a string, number or boolean), got %s; nested values are not supported: the node record's attributes map names to strings",
		func(key, _ string, v *yaml.Node) {
			if isNull(v) {
				out[key] = ""
			} else {
				out[key] = v.Value
			}
		})
	*a = out
}

// scalarPairs calls fn with each key of a mapping whose value is a scalar,
// and fails the keys that are not plain, and the values that are not
// scalars with notScalar (a format taking the value's description).
func (d *decoder) scalarPairs(path string, n *yaml.Node, notScalar string, fn func(key, kpath string, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		d.fail(path, n, "expected a mapping of names to values, got %s", describe(n))
		return
	}
	for _, p := range d.pairs(path, n) {
		v := resolveAlias(p.val)
		kpath := joinPath(path, p.key.Value)
		switch {
		case p.key.Kind != yaml.ScalarNode:
			d.fail(path, p.key, "expected a plain key, got %s", describe(p.key))
		case v == nil || v.Kind != yaml.ScalarNode:
			d.fail(kpath, p.val, notScalar, describe(p.val))
		default:
			fn(p.key.Value, kpath, v)
		}
	}
}

// Tags is a mapping of names to values that Nodepool hands to a cloud as
// strings (an aws label's tags and dynamic-tags, an aws diskimage's tags):
// a value written as a number, a boolean or nothing is the text Python's
// str() makes of what PyYAML read (true is "True", 1.50 is "1.5", nothing
// is "None"), as in Nodepool, with a warning.
type Tags map[string]string

func (t *Tags) decodeYAML(d *decoder, path string, n *yaml.Node) {
	out := Tags{}
	d.scalarPairs(path, n, "expected a string, got %s", func(key, kpath string, v *yaml.Node) {
		s, converted := pythonStr(v)
		if converted {
			d.warn(kpath, v, "%s is sent as the string %q, the text Python makes of it, as Nodepool does; quote the value to choose its text", describe(v), s)
		}
		out[key] = s
	})
	*t = out
}

// pythonStr is the text Python's str() makes of the value PyYAML reads
// from a scalar, and whether that differs from a string written as such
// (a number, a boolean or nothing).
func pythonStr(n *yaml.Node) (string, bool) {
	plain := n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0
	if !plain {
		return n.Value, false
	}
	if b, ok := yamlBool(n); ok {
		if b {
			return "True", true
		}
		return "False", true
	}
	switch n.Tag {
	case "!!null":
		return "None", true
	case "!!int":
		text := strings.ReplaceAll(n.Value, "_", "")
		if strings.Contains(strings.ToLower(text), "0o") {
			return n.Value, false // YAML 1.2's octal is a string to PyYAML
		}
		if i, err := strconv.ParseInt(text, 0, 64); err == nil {
			return strconv.FormatInt(i, 10), true
		}
		return n.Value, false
	case "!!float":
		text := strings.ReplaceAll(n.Value, "_", "")
		lower := strings.ToLower(text)
		switch strings.TrimLeft(lower, "+-") {
		case ".inf":
			if strings.HasPrefix(lower, "-") {
				return "-inf", true
			}
			return "inf", true
		case ".nan":
			return "nan", true
		}
		if !strings.Contains(text, ".") {
			return n.Value, false // 1e3 is a string to PyYAML, which wants a dot
		}
		if f, err := strconv.ParseFloat(text, 64); err == nil {
			return pythonFloat(f), true
		}
	}
	return n.Value, false
}

// pythonFloat writes a float as Python's repr does: the shortest digits,
// fixed notation for exponents from -4 to 15 (with ".0" when whole),
// else d.ddde+XX.
func pythonFloat(f float64) string {
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	_, exp, _ := strings.Cut(sci, "e")
	e, _ := strconv.Atoi(exp)
	if e < -4 || e >= 16 {
		return sci
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
