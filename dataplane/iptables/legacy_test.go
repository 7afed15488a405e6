package iptables

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

// TestModuleAvailable: a module counts as available when /sys/module has
// it, or modules.dep or modules.builtin of the running kernel lists it,
// compressed or not; a module with a similar name does not count.
func TestModuleAvailable(t *testing.T) {
	write := func(dir, name, text string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	sys, dep, builtin, none := filepath.Join(root, "sys"), filepath.Join(root, "dep"), filepath.Join(root, "builtin"), filepath.Join(root, "none")
	if err := os.MkdirAll(filepath.Join(sys, "ip_tables"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(dep, "modules.dep", "kernel/net/netfilter/x_tables.ko.zst:\n"+
		"kernel/net/ipv6/netfilter/ip6_tables.ko.zst: kernel/net/netfilter/x_tables.ko.zst\n"+
		"kernel/net/ipv4/netfilter/arp_tables.ko.zst: kernel/net/netfilter/x_tables.ko.zst\n")
	write(builtin, "modules.builtin", "kernel/net/netfilter/x_tables.ko\nkernel/net/ipv4/netfilter/ip_tables.ko\n")
	for _, c := range []struct {
		sys, modDir, name string
		want              bool
	}{
		{sys, none, "ip_tables", true},
		{none, dep, "ip6_tables", true},
		{none, dep, "ip_tables", false}, // only ip6_tables and arp_tables
		{none, builtin, "ip_tables", true},
		{none, builtin, "ip6_tables", false},
		{none, none, "ip_tables", false},
	} {
		if got := moduleAvailable(c.sys, c.modDir, c.name); got != c.want {
			t.Errorf("moduleAvailable(%s, %s, %s) = %v, want %v", filepath.Base(c.sys), filepath.Base(c.modDir), c.name, got, c.want)
		}
	}
}

// TestLegacySupportedHere: on this kernel, whose x_tables are loaded or
// built in, a fresh namespace without any legacy table passes the check,
// and the check creates no table.
func TestLegacySupportedHere(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	r := runner{netns: node.Path(), mode: ModeLegacy}
	for _, f := range families {
		before, err := r.legacyTables(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.legacySupported(f); err != nil {
			t.Errorf("legacySupported(%s): %v", f, err)
		}
		after, err := r.legacyTables(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(after) != len(before) {
			t.Errorf("%s legacy tables %v before the check, %v after", f, before, after)
		}
	}
}
