package iptables

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestWithHooks checks the payload surgery of withHooks on its own: hooks
// of the section's table that save lacks are inserted at the top of the
// section (after declarations of their targets that the section makes
// anyway, and before a leading -S), a table without a section gets one of
// its own, and hooks present in save are left out.
func TestWithHooks(t *testing.T) {
	const (
		pre  = `-I PREROUTING 1 -m comment --comment "vipd service VIPs" -j VIPD-SERVICES`
		out  = `-I OUTPUT 1 -m comment --comment "vipd service VIPs" -j VIPD-SERVICES`
		post = `-I POSTROUTING 1 -m comment --comment "vipd hairpin masquerade" -j VIPD-POSTROUTING`
		in   = `-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "vipd services without backends" -j VIPD-REJECT`
		fwd  = `-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "vipd services without backends" -j VIPD-REJECT`
		fout = `-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment "vipd services without backends" -j VIPD-REJECT`
	)
	// save holds every hook but nat PREROUTING and filter FORWARD.
	save := "*nat\n" +
		`-A OUTPUT -m comment --comment "vipd service VIPs" -j VIPD-SERVICES` + "\n" +
		`-A POSTROUTING -m comment --comment "vipd hairpin masquerade" -j VIPD-POSTROUTING` + "\n" +
		"COMMIT\n*filter\n" +
		`-A INPUT -m conntrack --ctstate NEW -m comment --comment "vipd services without backends" -j VIPD-REJECT` + "\n" +
		`-A OUTPUT -m conntrack --ctstate NEW -m comment --comment "vipd services without backends" -j VIPD-REJECT` + "\n" +
		"COMMIT\n"
	for _, c := range []struct {
		name, payload, save, want string
		table                     Table
		added                     []string
	}{{
		name:  "nat: nothing to write, no hooks",
		table: NAT,
		want:  "*nat\n" + pre + "\n" + out + "\n" + post + "\nCOMMIT\n",
		added: []string{"nat PREROUTING -> VIPD-SERVICES", "nat OUTPUT -> VIPD-SERVICES", "nat POSTROUTING -> VIPD-POSTROUTING"},
	}, {
		name:  "filter: nothing to write, no hooks",
		table: Filter,
		want:  "*filter\n" + in + "\n" + fwd + "\n" + fout + "\nCOMMIT\n",
		added: []string{"filter INPUT -> VIPD-REJECT", "filter FORWARD -> VIPD-REJECT", "filter OUTPUT -> VIPD-REJECT"},
	}, {
		name:    "every hook present",
		table:   NAT,
		payload: "*nat\n:VIPD-SERVICES - [0:0]\nCOMMIT\n",
		save:    save + "*nat\n" + `-A PREROUTING -m comment --comment "vipd service VIPs" -j VIPD-SERVICES` + "\nCOMMIT\n",
		want:    "*nat\n:VIPD-SERVICES - [0:0]\nCOMMIT\n",
	}, {
		name:  "nothing to write, every hook present",
		table: Filter,
		save:  save + "*filter\n" + `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "vipd services without backends" -j VIPD-REJECT` + "\nCOMMIT\n",
		want:  "",
	}, {
		name:    "declared target first, before a leading -S",
		table:   NAT,
		payload: "*nat\n-S\n:VIPD-SVC-X - [0:0]\n:VIPD-SERVICES - [0:0]\n-A VIPD-SERVICES -j VIPD-SVC-X\nCOMMIT\n",
		save:    save,
		want:    "*nat\n:VIPD-SERVICES - [0:0]\n" + pre + "\n-S\n:VIPD-SVC-X - [0:0]\n:VIPD-SERVICES - [0:0]\n-A VIPD-SERVICES -j VIPD-SVC-X\nCOMMIT\n",
		added:   []string{"nat PREROUTING -> VIPD-SERVICES"},
	}, {
		name:    "target not declared: it exists already",
		table:   Filter,
		payload: "*filter\n:VIPD-CANARY - [0:0]\nCOMMIT\n",
		save:    save,
		want:    "*filter\n" + fwd + "\n:VIPD-CANARY - [0:0]\nCOMMIT\n",
		added:   []string{"filter FORWARD -> VIPD-REJECT"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			var payload []byte
			if c.payload != "" {
				payload = []byte(c.payload)
			}
			got, added := withHooks(payload, IPv4, c.table, []byte(c.save))
			if diff := cmp.Diff(c.want, string(got)); diff != "" {
				t.Errorf("payload (-want +got):\n%s", diff)
			}
			if c.want == "" && got != nil {
				t.Errorf("payload %q, want nil", got)
			}
			if !slices.Equal(added, c.added) {
				t.Errorf("added %q, want %q", added, c.added)
			}
		})
	}
}
