package iptables_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane/iptables"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// nftAddQuotaRule appends to chain of the ip table an nft-native rule that
// iptables-nft cannot translate (a quota expression), as `nft add rule ip
// nat PREROUTING quota over 1 tbytes` would, over netlink (the nft tool is
// not installed everywhere).
func nftAddQuotaRule(t *testing.T, node *netlab.Node, table, chain string) {
	t.Helper()
	c := dialNetfilter(t, node)
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_RULE_TABLE, table)
	ae.String(unix.NFTA_RULE_CHAIN, chain)
	ae.Nested(unix.NFTA_RULE_EXPRESSIONS, func(nae *netlink.AttributeEncoder) error {
		nae.Nested(unix.NFTA_LIST_ELEM, func(e *netlink.AttributeEncoder) error {
			e.String(unix.NFTA_EXPR_NAME, "quota")
			e.Nested(unix.NFTA_EXPR_DATA, func(q *netlink.AttributeEncoder) error {
				q.ByteOrder = binary.BigEndian
				q.Uint64(unix.NFTA_QUOTA_BYTES, 1<<40)
				q.Uint32(unix.NFTA_QUOTA_FLAGS, 0)
				return nil
			})
			return nil
		})
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	batch := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES}
	msgs := []netlink.Message{
		{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_BEGIN, Flags: netlink.Request}, Data: batch},
		{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE),
				Flags: netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Append},
			Data: append([]byte{unix.NFPROTO_IPV4, unix.NFNETLINK_V0, 0, 0}, attrs...),
		},
		{Header: netlink.Header{Type: unix.NFNL_MSG_BATCH_END, Flags: netlink.Request}, Data: batch},
	}
	if _, err := c.SendMessages(msgs); err != nil {
		t.Fatalf("add an nft-native rule: %v", err)
	}
	if _, err := c.Receive(); err != nil {
		t.Fatalf("add an nft-native rule to ip %s %s: %v", table, chain, err)
	}
}

// TestDriftNFTNativeRule: another tool's nft-native rule in a builtin chain
// that holds a vipd hook makes `iptables-nft -S` call the chain
// "incompatible", as it calls a missing one. That is not drift: DetectDrift
// reports no missing hook, and a full Apply inserts no second hook.
func TestDriftNFTNativeRule(t *testing.T) {
	node := netlab.New(t, netlab.Spec{}).Node(1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dp, err := iptables.New(ctx, hclog.NewNullLogger(), iptables.Config{NetNS: node.Path(), Mode: iptables.ModeNFT})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if err := dp.Apply(ctx, liveState(nil, liveService("web", "198.19.0.10", 80))); err != nil {
		t.Fatal(err)
	}
	nftAddQuotaRule(t, node, "nat", "PREROUTING")
	if out, err := node.Exec(ctx, "iptables-nft", "-t", "nat", "-S", "PREROUTING"); err == nil || !strings.Contains(err.Error(), "incompatible") {
		t.Fatalf("iptables-nft -S of a chain with an nft-native rule: %v\n%s; want it called incompatible", err, out)
	}
	drift, err := dp.DetectDrift(ctx)
	if err != nil {
		t.Fatalf("DetectDrift: %v", err)
	}
	for _, d := range drift {
		t.Errorf("drift reported: %s: %s", d.What, d.Detail)
	}
	if err := dp.Apply(ctx, liveState(nil, liveService("web", "198.19.0.10", 80))); err != nil {
		t.Fatal(err)
	}
	if n := nftJumps(t, node, "nat", "PREROUTING", "VIPD-SERVICES"); n != 1 {
		t.Errorf("after a full Apply, nat PREROUTING has %d jumps to VIPD-SERVICES, want 1", n)
	}
	drift, err = dp.DetectDrift(ctx)
	if err != nil || len(drift) != 0 {
		t.Errorf("DetectDrift after the full Apply: %v %v, want nothing", drift, err)
	}

	// A hook really gone from such a chain is still found.
	if _, err := node.Exec(ctx, "iptables-nft", "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "vipd service VIPs", "-j", "VIPD-SERVICES"); err != nil {
		t.Fatal(err)
	}
	if n := nftJumps(t, node, "nat", "PREROUTING", "VIPD-SERVICES"); n != 0 {
		t.Fatalf("after deleting the hook, nat PREROUTING has %d jumps to VIPD-SERVICES", n)
	}
	drift, err = dp.DetectDrift(ctx)
	if err != nil || len(drift) != 1 || drift[0].Detail != "ipv4 nat PREROUTING: no jump to VIPD-SERVICES" {
		t.Errorf("DetectDrift with the hook deleted: %v %v", drift, err)
	}
}

// nftJumps counts the rules of an ip table's chain whose verdict jumps to
// target, over netlink.
func nftJumps(t *testing.T, node *netlab.Node, table, chain, target string) int {
	t.Helper()
	c := dialNetfilter(t, node)
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_RULE_TABLE, table)
	ae.String(unix.NFTA_RULE_CHAIN, chain)
	attrs, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{unix.NFPROTO_IPV4, unix.NFNETLINK_V0, 0, 0}, attrs...),
	})
	if err != nil {
		t.Fatalf("list the rules of ip %s %s: %v", table, chain, err)
	}
	n := 0
	for _, m := range msgs {
		if bytes.Contains(m.Data, append([]byte(target), 0)) {
			n++
		}
	}
	return n
}
