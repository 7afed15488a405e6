package envflag_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/vipd/vipd/internal/envflag"
)

func TestName(t *testing.T) {
	for flag, want := range map[string]string{
		"max-services":       "VIPD_MAX_SERVICES",
		"socket":             "VIPD_SOCKET",
		"bpf-ct-timeout-tcp": "VIPD_BPF_CT_TIMEOUT_TCP",
	} {
		if got := envflag.Name("VIPD", flag); got != want {
			t.Errorf("Name(VIPD, %s) = %s, want %s", flag, got, want)
		}
	}
}

type flags struct {
	n      int
	d      time.Duration
	s      string
	on     bool
	cidrs  []string
	fs     *pflag.FlagSet
	parsed error
}

func parse(args ...string) *flags {
	f := &flags{fs: pflag.NewFlagSet("test", pflag.ContinueOnError)}
	f.fs.IntVar(&f.n, "max-services", 5, "")
	f.fs.DurationVar(&f.d, "resync-period", time.Hour, "")
	f.fs.StringVar(&f.s, "socket", "/run/vipd/vipd.sock", "")
	f.fs.BoolVar(&f.on, "pprof", false, "")
	f.fs.StringSliceVar(&f.cidrs, "service-cidr", []string{"10.0.0.0/8"}, "")
	f.parsed = f.fs.Parse(args)
	return f
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestApply(t *testing.T) {
	f := parse("--socket", "/from/flag")
	err := envflag.Apply(f.fs, "VIPD", env(map[string]string{
		"VIPD_MAX_SERVICES":  "7",
		"VIPD_RESYNC_PERIOD": "90s",
		"VIPD_SOCKET":        "/from/env",
		"VIPD_PPROF":         "true",
		"VIPD_SERVICE_CIDR":  "198.19.0.0/16,fd00:198::/64",
		"OTHER_MAX_SERVICES": "9",
	}))
	if err != nil || f.parsed != nil {
		t.Fatal(err, f.parsed)
	}
	if f.n != 7 || f.d != 90*time.Second || !f.on {
		t.Errorf("from the environment: max-services %d, resync-period %v, pprof %v; want 7, 1m30s, true", f.n, f.d, f.on)
	}
	if f.s != "/from/flag" {
		t.Errorf("socket %q: the command line must win over VIPD_SOCKET", f.s)
	}
	if want := []string{"198.19.0.0/16", "fd00:198::/64"}; !slices.Equal(f.cidrs, want) {
		t.Errorf("service-cidr %v, want %v (comma-separated, replacing the default)", f.cidrs, want)
	}
}

func TestApplyUnsetKeepsDefaults(t *testing.T) {
	f := parse()
	if err := envflag.Apply(f.fs, "VIPD", env(nil)); err != nil {
		t.Fatal(err)
	}
	if f.n != 5 || f.d != time.Hour || f.s != "/run/vipd/vipd.sock" || f.on || !slices.Equal(f.cidrs, []string{"10.0.0.0/8"}) {
		t.Errorf("defaults changed without any variable: %+v", f)
	}
}

func TestApplyInvalidNamesVariable(t *testing.T) {
	f := parse()
	err := envflag.Apply(f.fs, "VIPD", env(map[string]string{"VIPD_MAX_SERVICES": "many"}))
	if err == nil || !strings.Contains(err.Error(), "VIPD_MAX_SERVICES") || !strings.Contains(err.Error(), "--max-services") {
		t.Fatalf("invalid value: %v, want an error naming VIPD_MAX_SERVICES and --max-services", err)
	}
}
