package iptables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/nsdo"
)

// iptables-nft cannot print a chain that holds rules it cannot translate
// (added with nft, such as `nft add rule ip nat PREROUTING quota ...`): it
// calls the chain "incompatible", as 1.8.9 also calls a missing one, and
// iptables-nft-save prints no rule of its table. These functions ask
// nf_tables over netlink instead, in nft mode only.

// errIncompatible is a chain that exists but that iptables-nft cannot
// print.
var errIncompatible = errors.New("holds rules that iptables-nft cannot read (added with nft)")

// incompatible tells from iptables-nft's output or stderr that it could
// not print a chain or table.
func incompatible(out string) bool { return strings.Contains(out, "is incompatible, use 'nft' tool") }

func nfproto(f Family) uint8 {
	if f == IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// nftRules returns the netlink messages of the rules of one nf_tables
// chain, and whether the chain exists.
func (r runner) nftRules(f Family, t Table, chain string) (rules [][]byte, exists bool, err error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_RULE_TABLE, string(t))
	ae.String(unix.NFTA_RULE_CHAIN, chain)
	attrs, err := ae.Encode()
	if err != nil {
		return nil, false, err
	}
	err = nsdo.Do(r.netns, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		hdr := []byte{nfproto(f), unix.NFNETLINK_V0, 0, 0}
		// GETCHAIN fails with ENOENT when the chain (or table) is missing.
		cae := netlink.NewAttributeEncoder()
		cae.String(unix.NFTA_CHAIN_TABLE, string(t))
		cae.String(unix.NFTA_CHAIN_NAME, chain)
		cattrs, err := cae.Encode()
		if err != nil {
			return err
		}
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETCHAIN), Flags: netlink.Request},
			Data:   append(hdr, cattrs...),
		})
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("get chain: %w", err)
		}
		exists = true
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE), Flags: netlink.Request | netlink.Dump},
			Data:   append(hdr, attrs...),
		})
		if err != nil {
			return fmt.Errorf("list rules: %w", err)
		}
		for _, m := range msgs {
			rules = append(rules, m.Data)
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("nf_tables %s %s %s: %w", f, t, chain, err)
	}
	return rules, exists, nil
}

// nftHasJump reports whether a rule of chain jumps to target: its verdict
// names target (a NUL-terminated NFTA_VERDICT_CHAIN).
func nftHasJump(rules [][]byte, target string) bool {
	name := append([]byte(target), 0)
	for _, r := range rules {
		if bytes.Contains(r, name) {
			return true
		}
	}
	return false
}

// nftHookLines returns, as iptables-save lines, vipd's hooks of family f
// that are in place in the tables whose save output says they are
// incompatible, so that a full sync does not insert them a second time.
func (r runner) nftHookLines(f Family, save []byte) ([]byte, error) {
	if !incompatible(string(save)) {
		return nil, nil
	}
	var out []byte
	for _, h := range Hooks(f) {
		if !strings.Contains(string(save), "Table `"+string(h.Table)+"' is incompatible") {
			continue
		}
		rules, _, err := r.nftRules(f, h.Table, h.Chain)
		if err != nil {
			return nil, err
		}
		if nftHasJump(rules, h.Target()) {
			out = append(out, hookLine("-A", h)+"\n"...)
		}
	}
	return out, nil
}

// nftGen returns the nf_tables generation of the namespace: a counter
// that every committed nf_tables transaction in it (any table, any family,
// any tool) increments by one, and that reads never change. DetectDrift
// compares it with the generation at which it last knew the rules to be
// what vipd applied.
func (r runner) nftGen() (uint32, error) {
	var gen uint32
	err := nsdo.Do(r.netns, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
			Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
		})
		if err != nil {
			return err
		}
		if len(msgs) != 1 || len(msgs[0].Data) < 4 {
			return fmt.Errorf("%d answers", len(msgs))
		}
		ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		found := false
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				gen, found = ad.Uint32(), true
			}
		}
		if err := ad.Err(); err != nil {
			return err
		}
		if !found {
			return errors.New("no generation in the answer")
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("nf_tables generation: %w", err)
	}
	return gen, nil
}
