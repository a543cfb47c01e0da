package config

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestConfigFiles loads every file of testdata/configs, most of them
// Nodepool's documentation examples key by key, and checks what the
// file's own comments say is true of it:
//
//	# want <key path>: <value>   the loaded value (defaults applied)
//	# warning: <text>            a warning containing text
//	# warnings: none             no warning at all
//	# error: <text>              the load fails with an error containing text
//	# env: NAME=value            an environment variable for %(NODEPOOL_...)
//	# secure: <file>             the secure file (next to this one)
//
// Durations are written as Go prints them (1h0m0s), limits that are not
// set as "unlimited", lists as [a, b] and mappings as {k: v}.
func TestConfigFiles(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "configs", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	for _, file := range files {
		if strings.HasSuffix(file, ".secure.yaml") {
			continue
		}
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			t.Parallel()
			checkFile(t, file)
		})
	}
}

type expectations struct {
	wants    [][2]string // key path, value
	warnings []string
	noWarns  bool
	errors   []string
	env      []string
	secure   string
}

func readExpectations(t *testing.T, data []byte) expectations {
	var ex expectations
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		c, ok := strings.CutPrefix(line, "# ")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(c, "want "):
			path, val, ok := strings.Cut(strings.TrimPrefix(c, "want "), ": ")
			if !ok {
				t.Fatalf("bad want line %q; expected '# want <path>: <value>'", line)
			}
			ex.wants = append(ex.wants, [2]string{path, val})
		case c == "warnings: none":
			ex.noWarns = true
		case strings.HasPrefix(c, "warning: "):
			ex.warnings = append(ex.warnings, strings.TrimPrefix(c, "warning: "))
		case strings.HasPrefix(c, "error: "):
			ex.errors = append(ex.errors, strings.TrimPrefix(c, "error: "))
		case strings.HasPrefix(c, "env: "):
			ex.env = append(ex.env, strings.TrimPrefix(c, "env: "))
		case strings.HasPrefix(c, "secure: "):
			ex.secure = strings.TrimPrefix(c, "secure: ")
		}
	}
	if len(ex.wants)+len(ex.warnings)+len(ex.errors) == 0 && !ex.noWarns {
		t.Fatal("the file says nothing to check; add # want, # warning or # error lines")
	}
	return ex
}

func checkFile(t *testing.T, file string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	ex := readExpectations(t, data)
	in := Input{File: "nodepool.yaml", Data: data, Env: append([]string{"HOME=/root"}, ex.env...)}
	if ex.secure != "" {
		in.SecureFile = "secure.yaml"
		if in.SecureData, err = os.ReadFile(filepath.Join(filepath.Dir(file), ex.secure)); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := Decode(in)
	if len(ex.errors) > 0 {
		if err == nil {
			t.Fatalf("loaded; want errors %q", ex.errors)
		}
		for _, w := range ex.errors {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error lacks %q:\n%v", w, err)
			}
		}
		if !IsErrors(err) {
			t.Errorf("error is %T, not config.Errors", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("does not load: %v", err)
	}
	for _, w := range ex.wants {
		got, err := valueAt(reflect.ValueOf(cfg).Elem(), w[0])
		if err != nil {
			t.Errorf("%s: %v", w[0], err)
			continue
		}
		if got != w[1] {
			t.Errorf("%s = %s, want %s", w[0], got, w[1])
		}
	}
	warns := cfg.Warnings.Error()
	for _, w := range ex.warnings {
		if !strings.Contains(warns, w) {
			t.Errorf("warnings lack %q:\n%s", w, warns)
		}
	}
	if ex.noWarns && len(cfg.Warnings) > 0 {
		t.Errorf("want no warning, got:\n%s", warns)
	}
}

// valueAt follows a key path (labels[0].name, env-vars.TMPDIR) through a
// loaded configuration by the keys' names in the file, and prints what it
// finds.
func valueAt(v reflect.Value, path string) (string, error) {
	for _, seg := range splitPath(path) {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return "", fmt.Errorf("nil before %q", seg)
			}
			v = v.Elem()
		}
		if i, err := strconv.Atoi(seg); err == nil && v.Kind() == reflect.Slice {
			if i >= v.Len() {
				return "", fmt.Errorf("index %d beyond %d items", i, v.Len())
			}
			v = v.Index(i)
			continue
		}
		switch v.Kind() {
		case reflect.Map:
			e := v.MapIndex(reflect.ValueOf(seg).Convert(v.Type().Key()))
			if !e.IsValid() {
				return "", fmt.Errorf("no key %q (keys: %v)", seg, v.MapKeys())
			}
			v = e
		case reflect.Struct:
			f, ok := structKey(v, seg)
			if !ok {
				return "", fmt.Errorf("no key %q in %s", seg, v.Type())
			}
			v = f
		default:
			return "", fmt.Errorf("cannot take %q of %s", seg, v.Type())
		}
	}
	return show(v), nil
}

func splitPath(path string) []string {
	var out []string
	for _, part := range strings.Split(path, ".") {
		name, rest, _ := strings.Cut(part, "[")
		if name != "" {
			out = append(out, name)
		}
		for rest != "" {
			idx, after, _ := strings.Cut(rest, "]")
			out = append(out, idx)
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return out
}

// structKey finds a key of a struct, looking into inline structs and an
// inline map (the other limits of a tenant). Of several fields of one key
// (one per driver), the first that is set is taken.
func structKey(v reflect.Value, key string) (reflect.Value, bool) {
	var first reflect.Value
	for _, f := range fieldsOf(v.Type()) {
		if f.name != key {
			continue
		}
		fv := v.FieldByIndex(f.index)
		if !fv.IsZero() {
			return fv, true
		}
		if !first.IsValid() {
			first = fv
		}
	}
	if first.IsValid() {
		return first, true
	}
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Tag.Get("yaml") == ",inline" && f.Type.Kind() == reflect.Map {
			if e := v.Field(i).MapIndex(reflect.ValueOf(key)); e.IsValid() {
				return e, true
			}
		}
	}
	return reflect.Value{}, false
}

func show(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case Duration:
		return x.D().String()
	case Age:
		return x.D().String()
	case time.Duration:
		return x.String()
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return "nil"
		}
		return show(v.Elem())
	case reflect.Int:
		if v.Int() == int64(Unlimited) {
			return "unlimited"
		}
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = show(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Map:
		var parts []string
		for _, k := range v.MapKeys() {
			parts = append(parts, fmt.Sprintf("%v: %s", k, show(v.MapIndex(k))))
		}
		slices.Sort(parts)
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v.Interface())
}
