package main

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// documentedDefaults are the flags whose README default is words rather
// than the flag's own default value. The value is checked too, so that
// changing such a default still needs the README row to change.
var documentedDefaults = map[string]struct{ value, readme string }{
	"socket-mode":  {"", "`0600`, or `0660` with `--socket-group`"},
	"socket-group": {"", "vipd's group"},
	"cgroup-path":  {"", "root of a cgroup2 mount at /run/vipd/cgroupv2 (mounted if absent)"},
	"gc-percent":   {"0", "50 (GOGC if set)"},
	"memory-limit": {"0", "GOMEMLIMIT"},
	"node-name":    {"", "the host name, in lower case"},
}

// TestREADMEFlagTable checks that every vipd run flag has a row in the
// README's daemon flag table with its default, and that the table names no
// flag vipd does not have.
func TestREADMEFlagTable(t *testing.T) {
	rows := readmeFlagTable(t, "../../README.md", "### Daemon flags")
	flags := runCommand().Flags()
	flags.VisitAll(func(f *pflag.Flag) {
		doc, ok := rows[f.Name]
		if !ok {
			t.Errorf("--%s (default %q) has no row in the README's daemon flag table", f.Name, f.DefValue)
			return
		}
		want := f.DefValue
		if d, ok := documentedDefaults[f.Name]; ok {
			if f.DefValue != d.value {
				t.Errorf("--%s's default is %q, but the README says %q for %q: update both", f.Name, f.DefValue, d.readme, d.value)
				return
			}
			want = d.readme
		}
		if normDefault(doc) != normDefault(want) {
			t.Errorf("--%s: the README's default is %q, the flag's %q", f.Name, doc, f.DefValue)
		}
	})
	for name := range rows {
		if flags.Lookup(name) == nil {
			t.Errorf("the README's daemon flag table lists --%s, which vipd run does not have", name)
		}
	}
}

var (
	flagName     = regexp.MustCompile("`--([a-z0-9-]+)`")
	defaultSplit = regexp.MustCompile(`\s+/\s+|,\s+`)
)

// readmeFlagTable parses the first table after heading in the file at
// path: flag name → its default as written. A row may name several flags
// ("`--a`, `--b`"); its default cell then lists their defaults in order,
// separated by ", " or " / ", or is empty when none has one.
func readmeFlagTable(t *testing.T, path, heading string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]string{}
	in, inTable := false, false
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in:
			in = strings.HasPrefix(line, heading)
			continue
		case !strings.HasPrefix(line, "|"):
			if inTable {
				return rows
			}
			continue
		}
		inTable = true
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Fatalf("README table row %q has fewer than 3 cells", line)
		}
		names := flagName.FindAllStringSubmatch(cells[1], -1)
		if len(names) == 0 {
			continue // the header and its separator
		}
		def := strings.TrimSpace(cells[2])
		var defs []string
		switch {
		case len(names) == 1:
			defs = []string{def}
		case def == "":
			defs = make([]string, len(names))
		default:
			defs = defaultSplit.Split(def, -1)
		}
		if len(defs) != len(names) {
			t.Errorf("README row for %s: %d defaults (%q) for %d flags", strings.TrimSpace(cells[1]), len(defs), def, len(names))
			continue
		}
		for i, n := range names {
			if _, dup := rows[n[1]]; dup {
				t.Errorf("the README's daemon flag table has two rows for --%s", n[1])
			}
			rows[n[1]] = defs[i]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no table after %q", path, heading)
	}
	return rows
}

// normDefault puts a default as the README writes it and as pflag prints
// it into one form: no backquotes, off/on as false/true, a slice without
// brackets, durations as time.Duration prints them (1h for 1h0m0s), and
// sizes as plain numbers (64 MiB, 2,000,000).
func normDefault(s string) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "`", ""))
	switch s {
	case "off":
		return "false"
	case "on":
		return "true"
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	if d, err := time.ParseDuration(s); err == nil && s != "0" {
		return d.String()
	}
	if n, err := strconv.ParseInt(strings.ReplaceAll(s, ",", ""), 10, 64); err == nil {
		return strconv.FormatInt(n, 10)
	}
	for suffix, mult := range map[string]int64{" KiB": 1 << 10, " MiB": 1 << 20, " GiB": 1 << 30} {
		if num, ok := strings.CutSuffix(s, suffix); ok {
			if n, err := strconv.ParseInt(num, 10, 64); err == nil {
				return strconv.FormatInt(n*mult, 10)
			}
		}
	}
	return s
}

func TestNormDefault(t *testing.T) {
	for _, tc := range [][2]string{
		{"1h", "1h0m0s"}, {"60s", "1m0s"}, {"24h", "24h0m0s"}, {"5s", "5s"},
		{"off", "false"}, {"`auto`", "auto"}, {"`veth*,lxc*,cali*`", "[veth*,lxc*,cali*]"},
		{"", "[]"}, {"64 MiB", "67108864"}, {"8 MiB", "8388608"}, {"2,000,000", "2000000"},
		{"`0660`", "0660"},
	} {
		if a, b := normDefault(tc[0]), normDefault(tc[1]); a != b {
			t.Errorf("normDefault(%q) = %q, normDefault(%q) = %q; want equal", tc[0], a, tc[1], b)
		}
	}
	for _, tc := range [][2]string{{"1h", "2h0m0s"}, {"off", "true"}, {"64 MiB", "67108865"}, {"0660", "0600"}, {"100", "1000"}} {
		if normDefault(tc[0]) == normDefault(tc[1]) {
			t.Errorf("normDefault(%q) == normDefault(%q); want different", tc[0], tc[1])
		}
	}
}
