package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Input is what a configuration is decoded from: nodepool.yaml, the
// optional secure file merged over it, and the environment that fills
// %(NODEPOOL_...) placeholders.
type Input struct {
	File string
	Data []byte
	// SecureFile and SecureData are the secure file ("" and nil: none).
	SecureFile string
	SecureData []byte
	// Env is the environment as KEY=value; nil means the process's own.
	Env []string
}

// Load reads, decodes and validates a nodepool.yaml. Every problem found is
// returned together, as Errors; warnings are in the Config's Warnings.
func Load(path string) (*Config, error) { return LoadFiles(path, "") }

// LoadFiles is Load with a secure file (`nodepool -s`) merged over the
// configuration; secure "" means none.
func LoadFiles(path, secure string) (*Config, error) {
	in := Input{File: path, SecureFile: secure}
	var err error
	if in.Data, err = readFile(path, "configuration", "-c FILE or NODEPOOL_CONFIG"); err != nil {
		return nil, err
	}
	if secure != "" {
		if in.SecureData, err = readFile(secure, "secure file", "-s FILE or NODEPOOL_SECURE"); err != nil {
			return nil, err
		}
	}
	return Decode(in)
}

func readFile(path, what, how string) ([]byte, error) {
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s %s does not exist; name another with %s: %w", what, path, how, err)
	case err != nil:
		return nil, fmt.Errorf("reading %s %s: %w", what, path, err)
	}
	return data, nil
}

// Parse decodes and validates the text of a nodepool.yaml; file names it in
// messages. %(NODEPOOL_...) placeholders are filled from the process's
// environment.
func Parse(file string, data []byte) (*Config, error) {
	return Decode(Input{File: file, Data: data})
}

// Decode decodes and validates a configuration.
func Decode(in Input) (*Config, error) {
	env := in.Env
	if env == nil {
		env = os.Environ()
	}
	d := &decoder{file: in.File, env: env}
	root := d.parseYAML(substitute(in.Data, env))
	if root == nil {
		return nil, d.errs
	}
	cfg := &Config{File: in.File, SecureFile: in.SecureFile}
	d.decodeStruct("", root, reflect.ValueOf(cfg).Elem())
	if signs := looksPre3(root); signs != nil && len(d.errs) > 0 {
		// Said once, first (line 0 sorts before every other).
		d.errs = append(d.errs, &Error{File: in.File, Msg: pre3Message(signs)})
	}
	if !d.blocked() {
		cfg.resolveDiskimages(d, root)
	}
	if !d.blocked() && in.SecureFile != "" {
		cfg.mergeSecure(d, in.SecureFile, substitute(in.SecureData, env))
	}
	if !d.blocked() {
		cfg.applyDefaults()
		cfg.applyImageDefaults()
		cfg.validate(d, root)
		cfg.deriveStaticLabels()
	}
	if len(d.errs) > 0 {
		return nil, sortErrors(d.errs)
	}
	cfg.Warnings = sortErrors(d.warns)
	return cfg, nil
}

// placeholderRE matches Nodepool's %(NODEPOOL_...) placeholders.
var placeholderRE = regexp.MustCompile(`%\((NODEPOOL_[A-Za-z0-9_]*)\)`)

// substitute replaces every %(NODEPOOL_X) whose variable is set in env by
// its value, in the file's text before it is parsed, as Nodepool does; a
// placeholder of a variable that is not set stays as written.
func substitute(data []byte, env []string) []byte {
	if !bytes.Contains(data, []byte("%(NODEPOOL_")) {
		return data
	}
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "NODEPOOL_") {
			vars[k] = v
		}
	}
	return placeholderRE.ReplaceAllFunc(data, func(m []byte) []byte {
		if v, ok := vars[string(m[2:len(m)-1])]; ok {
			return []byte(v)
		}
		return m
	})
}

// maxFaultSearch bounds the lines searched for where a YAML syntax error
// is (each step parses the text once more).
const maxFaultSearch = 2000

// parseYAML parses a file into its root node, or reports why it cannot.
func (d *decoder) parseYAML(data []byte) *yaml.Node {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		from := 1
		if n, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(msg, "line ") {
			msg = rest
			if l, err := strconv.Atoi(strings.TrimPrefix(n, "line ")); err == nil && l > 0 {
				from = l
			}
		}
		line := faultLine(data, from)
		d.errs = append(d.errs, &Error{File: d.file, Line: line, Msg: "not valid YAML: " + msg})
		return nil
	}
	if len(doc.Content) == 0 || isNull(doc.Content[0]) {
		d.fail("", nil, "the file is empty; expected a mapping with labels and providers")
		return nil
	}
	root := resolveAlias(doc.Content[0])
	if root == nil || root.Kind != yaml.MappingNode {
		d.fail("", doc.Content[0], "expected a mapping of sections (labels, providers, diskimages...), got %s", describe(doc.Content[0]))
		return nil
	}
	return root
}

// faultLine finds where a file stops being YAML: the first line, from
// the one the parser names (where the construct it was reading began),
// whose addition to the lines before it makes the text fail to parse.
func faultLine(data []byte, from int) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	var doc yaml.Node
	for k := from; k <= len(lines) && k < from+maxFaultSearch; k++ {
		if yaml.Unmarshal(bytes.Join(lines[:k], nil), &doc) != nil {
			return k
		}
	}
	return from
}

// sortErrors puts problems in file order (the main file before the
// secure one), keeping the order they were found in within a line.
func sortErrors(es Errors) Errors {
	slices.SortStableFunc(es, func(a, b *Error) int {
		if a.File != b.File {
			return 0
		}
		return cmp.Compare(a.Line, b.Line)
	})
	return es
}
