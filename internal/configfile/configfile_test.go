package configfile_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/vipd/vipd/internal/configfile"
	"github.com/vipd/vipd/internal/envflag"
)

type flags struct {
	n     int
	d     time.Duration
	s     string
	mode  string
	on    bool
	cidrs []string
	cfg   string
	fs    *pflag.FlagSet
}

func newFlags(t *testing.T, args ...string) *flags {
	t.Helper()
	f := &flags{fs: pflag.NewFlagSet("vipd run", pflag.ContinueOnError)}
	f.fs.IntVar(&f.n, "max-services", 5, "")
	f.fs.DurationVar(&f.d, "resync-period", time.Hour, "")
	f.fs.StringVar(&f.s, "socket", "/run/vipd/vipd.sock", "")
	f.fs.StringVar(&f.mode, "socket-mode", "", "")
	f.fs.BoolVar(&f.on, "pprof", false, "")
	f.fs.StringSliceVar(&f.cidrs, "service-cidr", []string{"10.0.0.0/8"}, "")
	f.fs.StringVar(&f.cfg, "config", "", "")
	if err := f.fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

func write(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vipd.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestApplySetsEveryKind(t *testing.T) {
	f := newFlags(t)
	path := write(t, `# comments are fine
max-services: 1000
resync-period: 90s
socket: /from/file
socket-mode: 0640
pprof: true
service-cidr:
  - 198.19.0.0/16
  - fd00:198::/64
`)
	if err := configfile.Apply(f.fs, path, "config"); err != nil {
		t.Fatal(err)
	}
	if f.n != 1000 || f.d != 90*time.Second || f.s != "/from/file" || !f.on {
		t.Errorf("max-services %d, resync-period %v, socket %q, pprof %v; want 1000, 1m30s, /from/file, true", f.n, f.d, f.s, f.on)
	}
	if f.mode != "0640" {
		t.Errorf("socket-mode %q, want 0640 as written (not the number YAML makes of it)", f.mode)
	}
	if want := []string{"198.19.0.0/16", "fd00:198::/64"}; !slices.Equal(f.cidrs, want) {
		t.Errorf("service-cidr %v, want %v (the list, replacing the default)", f.cidrs, want)
	}
}

// TestPrecedence checks flag, then VIPD_<FLAG>, then the file.
func TestPrecedence(t *testing.T) {
	f := newFlags(t, "--socket", "/from/flag")
	env := map[string]string{"VIPD_MAX_SERVICES": "7"}
	if err := envflag.Apply(f.fs, "VIPD", func(k string) (string, bool) { v, ok := env[k]; return v, ok }); err != nil {
		t.Fatal(err)
	}
	path := write(t, "socket: /from/file\nmax-services: 1000\nresync-period: 2h\n")
	if err := configfile.Apply(f.fs, path, "config"); err != nil {
		t.Fatal(err)
	}
	if f.s != "/from/flag" {
		t.Errorf("socket %q: the command line must win over the file", f.s)
	}
	if f.n != 7 {
		t.Errorf("max-services %d: VIPD_MAX_SERVICES must win over the file", f.n)
	}
	if f.d != 2*time.Hour {
		t.Errorf("resync-period %v: the file must set what nothing else set", f.d)
	}
}

// TestSliceFromScalar checks that a repeatable flag also takes one value,
// comma-separated as on the command line, replacing its default.
func TestSliceFromScalar(t *testing.T) {
	f := newFlags(t)
	if err := configfile.Apply(f.fs, write(t, "service-cidr: 198.19.0.0/16,fd00:198::/64\n"), "config"); err != nil {
		t.Fatal(err)
	}
	if want := []string{"198.19.0.0/16", "fd00:198::/64"}; !slices.Equal(f.cidrs, want) {
		t.Errorf("service-cidr %v, want %v", f.cidrs, want)
	}
}

func TestEmptyFileKeepsDefaults(t *testing.T) {
	f := newFlags(t)
	if err := configfile.Apply(f.fs, write(t, "# everything is commented out\n"), "config"); err != nil {
		t.Fatal(err)
	}
	if f.n != 5 || f.s != "/run/vipd/vipd.sock" || !slices.Equal(f.cidrs, []string{"10.0.0.0/8"}) {
		t.Errorf("defaults changed by an empty file: %+v", f)
	}
}

func TestRefusals(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"unknown key", "max-service: 3\n", `unknown key "max-service"`},
		{"the config key itself", "config: /etc/other.yaml\n", `unknown key "config"`},
		{"help", "help: true\n", `unknown key "help"`},
		{"nested key", "ebpf:\n  bpffs: /sys/fs/bpf\n", `unknown key "ebpf.bpffs"`},
		{"bad int", "max-services: many\n", `key "max-services"`},
		{"bad duration", "resync-period: 3600\n", `key "resync-period"`},
		{"bad bool", "pprof: maybe\n", `key "pprof"`},
		{"list for a scalar", "socket: [a, b]\n", `key "socket": a list`},
		{"map in a list", "service-cidr:\n  - a: b\n", `key "service-cidr"`},
		{"twice", "socket: /a\nsocket: /b\n", `"socket" appears twice`},
		{"not a mapping", "- socket\n", "want a mapping"},
		{"not YAML", "socket: [\n", "vipd.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFlags(t)
			path := write(t, tc.body)
			err := configfile.Apply(f.fs, path, "config")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Apply(%q) = %v, want an error naming the file and containing %q", tc.body, err, tc.want)
			}
		})
	}
}

func TestMissingFile(t *testing.T) {
	f := newFlags(t)
	path := filepath.Join(t.TempDir(), "absent.yaml")
	if err := configfile.Apply(f.fs, path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Apply(missing file) = %v, want an error naming it", err)
	}
}
