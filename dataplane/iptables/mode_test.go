package iptables_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/netlink"
	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestModeLeavesOtherModeAlone opens the dataplane in a fresh node in each
// mode, and in auto, programs it, checks it for drift and cleans it up: the
// mode not in use must not get a table, not even an empty one.
func TestModeLeavesOtherModeAlone(t *testing.T) {
	for _, want := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy, iptables.ModeAuto} {
		t.Run(string(want), func(t *testing.T) {
			lab := netlab.New(t, netlab.Spec{})
			node := lab.Node(1)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			checkOther := func(step string, mode iptables.Mode) {
				t.Helper()
				var tables []string
				if mode == iptables.ModeNFT {
					tables = legacyTables(t, node)
				} else {
					tables = nftTables(t, node)
				}
				if len(tables) > 0 {
					t.Fatalf("after %s in mode %s, the other mode has tables: %v", step, mode, tables)
				}
			}

			dp, err := iptables.New(ctx, hclog.NewNullLogger(), iptables.Config{NetNS: node.Path(), Mode: want})
			if err != nil {
				t.Fatal(err)
			}
			defer dp.Close()
			mode := dp.Mode()
			if want == iptables.ModeAuto && mode != iptables.ModeNFT {
				t.Fatalf("auto picked %s in a fresh namespace, want nft", mode)
			}
			checkOther("New", mode)
			if err := dp.Apply(ctx, liveState(nil, liveService("web", "198.19.0.10", 80))); err != nil {
				t.Fatal(err)
			}
			if _, err := dp.DetectDrift(ctx); err != nil {
				t.Fatal(err)
			}
			checkOther("Apply and DetectDrift", mode)
			if !strings.Contains(saveRules(t, node, mode), "VIPD-CANARY") {
				t.Fatalf("mode %s holds no vipd chains after Apply", mode)
			}
			if err := iptables.Cleanup(ctx, hclog.NewNullLogger(), node.Path(), iptables.ModeAuto); err != nil {
				t.Fatal(err)
			}
			checkOther("Cleanup", mode)
		})
	}
}

// legacyTables lists the x_tables (iptables-legacy) tables of both families
// in node, as iptables-legacy-save shows them: it lists only tables that
// exist, without creating any.
func legacyTables(t *testing.T, node *netlab.Node) []string {
	t.Helper()
	var tables []string
	for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := node.Exec(context.Background(), tool)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(out) {
			if name, ok := strings.CutPrefix(strings.TrimSpace(line), "*"); ok {
				tables = append(tables, strings.TrimSuffix(tool, "-legacy-save")+" "+name)
			}
		}
	}
	return tables
}

// dialNetfilter opens a netfilter netlink socket in node's network
// namespace, closed when the test ends.
func dialNetfilter(t *testing.T, node *netlab.Node) *netlink.Conn {
	t.Helper()
	ns, err := netns.GetFromPath(node.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// nftTables lists the nf_tables tables of every family in node, as `nft
// list tables` would (the nft tool is not installed everywhere).
func nftTables(t *testing.T, node *netlab.Node) []string {
	t.Helper()
	c := dialNetfilter(t, node)
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETTABLE),
			Flags: netlink.Request | netlink.Dump,
		},
		// struct nfgenmsg: every family, version 0, resource 0.
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		t.Fatalf("list nf_tables tables: %v", err)
	}
	var tables []string
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_TABLE_NAME {
				tables = append(tables, fmt.Sprintf("family %d table %s", m.Data[0], ad.String()))
			}
		}
		if err := ad.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return tables
}

// nftFlushRuleset deletes every nf_tables table in node, as `nft flush
// ruleset` does: one batch with a table delete that names no table and no
// family.
func nftFlushRuleset(t *testing.T, node *netlab.Node) {
	t.Helper()
	c := dialNetfilter(t, node)
	// struct nfgenmsg; batch messages carry the subsystem in res_id.
	batch := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}
	msgs := []netlink.Message{
		{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: netlink.Request}, Data: batch},
		{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELTABLE), Flags: netlink.Request | netlink.Acknowledge},
			Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
		},
		{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: netlink.Request}, Data: batch},
	}
	sent, err := c.SendMessages(msgs)
	if err != nil {
		t.Fatalf("flush nf_tables ruleset: %v", err)
	}
	if _, err := c.Receive(); err != nil {
		t.Fatalf("flush nf_tables ruleset: %v (request %d)", err, sent[1].Header.Sequence)
	}
	if left := nftTables(t, node); len(left) > 0 {
		t.Fatalf("tables left after flushing the ruleset: %v", left)
	}
}
