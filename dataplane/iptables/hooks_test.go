package iptables

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestWithHooks checks the payload surgery of withHooks on its own: hooks
// that save lacks are inserted at the top of their table's section (after
// declarations of their targets that the section makes anyway, and before
// a leading -S), a table the payload lacks gets a section of its own, and
// hooks present in save are left out.
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
		added                     []string
	}{{
		name:    "nothing to write, no hooks",
		payload: "",
		save:    "",
		want: "*nat\n" + pre + "\n" + out + "\n" + post + "\nCOMMIT\n" +
			"*filter\n" + in + "\n" + fwd + "\n" + fout + "\nCOMMIT\n",
		added: []string{"nat PREROUTING -> VIPD-SERVICES", "nat OUTPUT -> VIPD-SERVICES", "nat POSTROUTING -> VIPD-POSTROUTING",
			"filter INPUT -> VIPD-REJECT", "filter FORWARD -> VIPD-REJECT", "filter OUTPUT -> VIPD-REJECT"},
	}, {
		name:    "every hook present",
		payload: "*nat\n:VIPD-SERVICES - [0:0]\nCOMMIT\n",
		save:    save + "*nat\n" + `-A PREROUTING -m comment --comment "vipd service VIPs" -j VIPD-SERVICES` + "\nCOMMIT\n*filter\n" + `-A FORWARD -m conntrack --ctstate NEW -m comment --comment "vipd services without backends" -j VIPD-REJECT` + "\nCOMMIT\n",
		want:    "*nat\n:VIPD-SERVICES - [0:0]\nCOMMIT\n",
	}, {
		name:    "declared target first, before a leading -S; filter section added",
		payload: "*nat\n-S\n:VIPD-SVC-X - [0:0]\n:VIPD-SERVICES - [0:0]\n-A VIPD-SERVICES -j VIPD-SVC-X\nCOMMIT\n",
		save:    save,
		want: "*nat\n:VIPD-SERVICES - [0:0]\n" + pre + "\n-S\n:VIPD-SVC-X - [0:0]\n:VIPD-SERVICES - [0:0]\n-A VIPD-SERVICES -j VIPD-SVC-X\nCOMMIT\n" +
			"*filter\n" + fwd + "\nCOMMIT\n",
		added: []string{"nat PREROUTING -> VIPD-SERVICES", "filter FORWARD -> VIPD-REJECT"},
	}, {
		name:    "target not declared: it exists already; nat section appended",
		payload: "*filter\n:VIPD-CANARY - [0:0]\nCOMMIT\n",
		save:    save,
		want:    "*filter\n" + fwd + "\n:VIPD-CANARY - [0:0]\nCOMMIT\n" + "*nat\n" + pre + "\nCOMMIT\n",
		added:   []string{"nat PREROUTING -> VIPD-SERVICES", "filter FORWARD -> VIPD-REJECT"},
	}} {
		t.Run(c.name, func(t *testing.T) {
			got, added := withHooks([]byte(c.payload), IPv4, []byte(c.save))
			if diff := cmp.Diff(c.want, string(got)); diff != "" {
				t.Errorf("payload (-want +got):\n%s", diff)
			}
			if !slices.Equal(added, c.added) {
				t.Errorf("added %q, want %q", added, c.added)
			}
		})
	}
}
