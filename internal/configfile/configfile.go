package configfile

import (
	"errors"
	"fmt"
	"slices"

	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// Apply sets every flag of fs that is not set yet (pflag.Flag.Changed is
// false: neither the command line nor the environment set it) from the
// YAML file at path, a mapping of flag name to value. Each value is parsed
// as the flag parses its command-line argument, from the text as written
// in the file (so socket-mode: 0640 is the octal mode, not the number
// YAML would make of it); a slice flag takes a YAML list, replacing its
// default, or one scalar as on the command line. The keys in skip (such as
// the flag that names the file) and help and version are refused like
// unknown keys.
//
// A file that does not parse, a key that names no flag (or is nested, or
// appears twice) and a value that the flag does not accept are errors
// naming the file and the key. Keys are checked before any flag is set;
// values are set in the order of their keys, and Apply returns at the
// first one the flag refuses, so a caller must not go on with fs after an
// error (vipd refuses to start).
func Apply(fs *pflag.FlagSet, path string, skip ...string) error {
	k := koanf.New(".")
	if err := k.Load(file.Provider(path), literalYAML{}); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	keys := k.Keys()
	slices.Sort(keys)
	type set struct {
		f    *pflag.Flag
		vals []string
		list bool
	}
	var sets []set
	for _, key := range keys {
		f := fs.Lookup(key)
		switch {
		case key == "help" || key == "version" || slices.Contains(skip, key):
			return fmt.Errorf("config file %s: unknown key %q: --%s cannot be set in a config file", path, key, key)
		case f == nil:
			return fmt.Errorf("config file %s: unknown key %q: it names no flag", path, key)
		}
		s := set{f: f}
		switch v := k.Get(key).(type) {
		case string:
			s.vals = []string{v}
		case []any:
			if _, ok := f.Value.(pflag.SliceValue); !ok {
				return fmt.Errorf("config file %s: key %q: a list, but --%s takes one value", path, key, key)
			}
			s.list = true
			for _, e := range v {
				str, ok := e.(string)
				if !ok {
					return fmt.Errorf("config file %s: key %q: a list may hold only plain values", path, key)
				}
				s.vals = append(s.vals, str)
			}
		default:
			return fmt.Errorf("config file %s: key %q: want a value or a list of values, not %T", path, key, v)
		}
		sets = append(sets, s)
	}
	for _, s := range sets {
		if s.f.Changed {
			continue
		}
		if err := setFlag(fs, s.f, s.vals, s.list); err != nil {
			return fmt.Errorf("config file %s: key %q: %w", path, s.f.Name, err)
		}
	}
	return nil
}

// setFlag sets f from vals: a list replaces a slice flag's value, a single
// value is set as on the command line.
func setFlag(fs *pflag.FlagSet, f *pflag.Flag, vals []string, list bool) error {
	if list {
		if err := f.Value.(pflag.SliceValue).Replace(vals); err != nil {
			return err
		}
		f.Changed = true
		return nil
	}
	return fs.Set(f.Name, vals[0])
}

// literalYAML is a koanf.Parser for YAML that keeps every scalar as the
// text written in the file, so that a flag parses it as it parses its
// command-line argument. koanf's own YAML parser resolves scalars first,
// which turns the octal mode 0640 into the number 416 and 1.0 into 1.
// Mappings nest (koanf flattens them to "a.b", which no flag is called),
// a null value is an empty string, and a key given twice is an error.
type literalYAML struct{}

func (literalYAML) Unmarshal(b []byte) (map[string]any, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	if doc.Kind == 0 || len(doc.Content) == 0 { // an empty file
		return map[string]any{}, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: want a mapping of flag names to values", root.Line)
	}
	v, err := literal(root)
	if err != nil {
		return nil, err
	}
	return v.(map[string]any), nil
}

func literal(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "", nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, e := range n.Content {
			v, err := literal(e)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		return l, nil
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i]
			if key.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: a key must be a plain name", key.Line)
			}
			if _, dup := m[key.Value]; dup {
				return nil, fmt.Errorf("line %d: key %q appears twice", key.Line, key.Value)
			}
			v, err := literal(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[key.Value] = v
		}
		return m, nil
	case yaml.AliasNode:
		return literal(n.Alias)
	}
	return nil, fmt.Errorf("line %d: unsupported YAML node", n.Line)
}

func (literalYAML) Marshal(map[string]any) ([]byte, error) {
	return nil, errors.New("configfile: writing a config file is not supported")
}
