/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * vipd's eBPF dataplane: ClusterIP load balancing.
 *
 *   vipd_from_pod  tc ingress of a pod's host-side veth: DNAT of new and
 *                  tracked flows to a backend; hairpin replies; rejects.
 *   vipd_to_pod    tc egress of a pod's host-side veth: reverse NAT of
 *                  replies, so the client only ever sees the VIP.
 *   vipd_from_ext  tc ingress of the node's external interfaces: node ports,
 *                  external and load-balancer IPs for traffic from outside
 *                  the node, under the external traffic policy (Cluster:
 *                  DNAT and SNAT to the node's address; Local: DNAT to a
 *                  node-local backend, or a drop); source ranges; reverse
 *                  translation of SNATed replies from remote backends.
 *   vipd_to_ext    tc egress of the external interfaces: reverse NAT of
 *                  replies of Local flows (client address kept).
 *   vipd_sock_*    cgroup sock_addr hooks: socket-level balancing for
 *                  processes of the node itself (connect, sendmsg, recvmsg,
 *                  getpeername), so no packet needs translating at all.
 *
 * Every lookup is a hash lookup: the cost per packet does not depend on the
 * number of services.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmpv6.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "maps.h"
#include "lb.h"

/* linux/icmp.h drags in libc's socket headers: the two bits we need. */
#define ICMP_DEST_UNREACH 3
#define ICMP_PORT_UNREACH 3
struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 unused;
};

#ifndef IPPROTO_SCTP
#define IPPROTO_SCTP 132
#endif
#define ECONNREFUSED 111
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

#define AF_INET 2
#define AF_INET6 10

char __license[] SEC("license") = "Dual BSD/GPL";

/* pkt is what the packet path knows about one IPv4 or IPv6 packet. */
struct pkt {
	union addr src;
	union addr dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 is6;
	__u8 tcp_flags;
	__u8 pad;
	__u32 l3_off;
	__u32 l4_off;
};

/*
 * parse_direct is parse for the common case, an IPv4 or IPv6 packet whose
 * headers are all in the skb's linear data: read in place, with no helper
 * call (FASTPATH.md). It returns 1 when it filled p, 0 when the packet is
 * none of TCP, UDP or SCTP (or a non-first fragment), and -1 when parse
 * must look at it.
 */
static __always_inline int parse_direct(struct __sk_buff *skb, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u8 *l4;

	if ((void *)(eth + 1) > end)
		return -1;
	p->l3_off = ETH_HLEN;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end)
			return -1;
		if (ip->version != 4 || ip->ihl < 5)
			return 0;
		if (ip->frag_off & bpf_htons(IP_OFFSET))
			return 0;
		p->is6 = 0;
		p->proto = ip->protocol;
		addr_from4(&p->src, ip->saddr);
		addr_from4(&p->dst, ip->daddr);
		p->l4_off = ETH_HLEN + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return -1;
		p->is6 = 1;
		p->proto = ip6->nexthdr;
		__builtin_memcpy(p->src.b, ip6->saddr.s6_addr, 16);
		__builtin_memcpy(p->dst.b, ip6->daddr.s6_addr, 16);
		p->l4_off = ETH_HLEN + sizeof(*ip6);
	} else {
		return 0;
	}
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP && p->proto != IPPROTO_SCTP)
		return 0;
	if (p->l4_off > 60 + ETH_HLEN)
		return -1;
	l4 = data + p->l4_off;
	if ((void *)(l4 + 14) > end)
		return -1;
	p->sport = *(__be16 *)l4;
	p->dport = *(__be16 *)(l4 + 2);
	p->tcp_flags = p->proto == IPPROTO_TCP ? l4[13] : 0;
	return 1;
}

/* parse fills p for TCP, UDP and SCTP packets; it returns -1 for others. */
static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	__be16 ports[2];
	__be16 eth_proto;
	int r = parse_direct(skb, p);

	if (r >= 0)
		return r ? 0 : -1;
	if (bpf_skb_load_bytes(skb, 12, &eth_proto, 2) < 0)
		return -1;
	p->l3_off = ETH_HLEN;
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return -1;
		if (ip.version != 4 || ip.ihl < 5)
			return -1;
		/* Only first fragments carry ports; the rest pass untouched. */
		if (ip.frag_off & bpf_htons(IP_OFFSET))
			return -1;
		p->is6 = 0;
		p->proto = ip.protocol;
		addr_from4(&p->src, ip.saddr);
		addr_from4(&p->dst, ip.daddr);
		p->l4_off = ETH_HLEN + ip.ihl * 4;
	} else if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return -1;
		p->is6 = 1;
		p->proto = ip6.nexthdr;
		__builtin_memcpy(p->src.b, ip6.saddr.s6_addr, 16);
		__builtin_memcpy(p->dst.b, ip6.daddr.s6_addr, 16);
		p->l4_off = ETH_HLEN + sizeof(ip6);
	} else {
		return -1;
	}
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP && p->proto != IPPROTO_SCTP)
		return -1;
	if (bpf_skb_load_bytes(skb, p->l4_off, ports, sizeof(ports)) < 0)
		return -1;
	p->sport = ports[0];
	p->dport = ports[1];
	p->tcp_flags = 0;
	if (p->proto == IPPROTO_TCP && bpf_skb_load_bytes(skb, p->l4_off + 13, &p->tcp_flags, 1) < 0)
		return -1;
	return 0;
}

static __always_inline int csum_off(const struct pkt *p)
{
	switch (p->proto) {
	case IPPROTO_TCP:
		return p->l4_off + 16;
	case IPPROTO_UDP:
		return p->l4_off + 6;
	}
	return -1; /* SCTP: its CRC32c covers no addresses, and ports never change */
}

#define SIDE_SRC 0
#define SIDE_DST 1

/* csum_replace4 updates the ones' complement checksum *sum, in place, for
 * a 32-bit word of the summed data going from from to to (RFC 1624). */
static __always_inline void csum_replace4(__u16 *sum, __be32 from, __be32 to)
{
	__u32 s = (__u16)~*sum;

	s += (__u16)~from + (__u16)~(from >> 16) + (__u16)to + (__u16)(to >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	*sum = ~(__u16)s;
}

/*
 * rewrite replaces the source or destination address and port of p,
 * updating the IPv4 header checksum and the L4 checksum incrementally
 * (which keeps CHECKSUM_PARTIAL packets right).
 *
 * The L4 checksum goes through bpf_l4_csum_replace, which knows the skb's
 * checksum state; the rest is written in place (FASTPATH.md 11): the IPv4
 * address with its header checksum (a change that leaves the header's sum,
 * and so skb->csum, as it was) and the port (whose change the L4 checksum
 * update cancels, as bpf_skb_store_bytes without flags did). The helper
 * made the headers up to the L4 checksum writable; SCTP, with no checksum
 * to update, pulls them.
 */
static __always_inline int rewrite(struct __sk_buff *skb, struct pkt *p, int side, const union addr *to, __be16 port)
{
	union addr *from = side == SIDE_SRC ? &p->src : &p->dst;
	__be16 *from_port = side == SIDE_SRC ? &p->sport : &p->dport;
	__u64 l4flags = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	int coff = csum_off(p);
	int addr_changes = !addr_eq(from, to), port_changes = *from_port != port;
	void *data, *end;

	if (!addr_changes && !port_changes)
		return 0;
	if (coff >= 0) {
		if (addr_changes) {
			if (!p->is6) {
				if (bpf_l4_csum_replace(skb, coff, from->w[3], to->w[3], BPF_F_PSEUDO_HDR | l4flags | 4) < 0)
					return -1;
			} else {
				__s64 diff = bpf_csum_diff(from->w, 16, (__be32 *)to->w, 16, 0);

				if (bpf_l4_csum_replace(skb, coff, 0, diff, BPF_F_PSEUDO_HDR | l4flags) < 0)
					return -1;
			}
		}
		if (port_changes && bpf_l4_csum_replace(skb, coff, *from_port, port, l4flags | 2) < 0)
			return -1;
	} else if (bpf_skb_pull_data(skb, p->l4_off + 4) < 0) {
		return -1;
	}
	if (addr_changes && p->is6) {
		/* With no IP header checksum to cancel the pseudo-header
		 * change, skb->csum (CHECKSUM_COMPLETE) must follow the new
		 * address bytes: the helper does that. */
		if (bpf_skb_store_bytes(skb, p->l3_off + (side == SIDE_SRC ? 8 : 24), to->b, 16, BPF_F_RECOMPUTE_CSUM) < 0)
			return -1;
	}
	/* Read by hand: clang otherwise keeps &skb->data_end across the
	 * inlined paths, which the verifier refuses (a modified ctx ptr). */
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(data) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data)));
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(end) : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, data_end)));
	if (addr_changes && !p->is6) {
		struct iphdr *ip = data + ETH_HLEN;

		if (p->l3_off != ETH_HLEN || (void *)(ip + 1) > end)
			return -1;
		csum_replace4(&ip->check, from->w[3], to->w[3]);
		if (side == SIDE_SRC)
			ip->saddr = to->w[3];
		else
			ip->daddr = to->w[3];
	}
	if (addr_changes)
		*from = *to;
	if (port_changes) {
		__u32 off = p->l4_off + (side == SIDE_SRC ? 0 : 2);
		__be16 *pp;

		if (off > ETH_HLEN + 60 + 2)
			return -1;
		pp = data + off;
		if ((void *)(pp + 1) > end)
			return -1;
		*pp = port;
		*from_port = port;
	}
	return 0;
}

/* bounce sends the (rewritten) frame back out of the interface it came in. */
static __always_inline int bounce(struct __sk_buff *skb)
{
	__u8 mac[12], swapped[12];

	if (bpf_skb_load_bytes(skb, 0, mac, 12) < 0)
		return TC_ACT_SHOT;
	__builtin_memcpy(swapped, mac + 6, 6);
	__builtin_memcpy(swapped + 6, mac, 6);
	if (bpf_skb_store_bytes(skb, 0, swapped, 12, 0) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ifindex, 0);
}

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

struct pseudo4 {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

struct pseudo6 {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 len;
	__u8 zero[3];
	__u8 nexthdr;
};

struct tcp_reset_fields {
	__be32 seq;
	__be32 ack_seq;
};

/*
 * rst_fields computes the sequence numbers of a RST answering the TCP
 * segment at p (RFC 9293 3.10.7.1), given the segment's payload length.
 */
static __always_inline int rst_fields(struct __sk_buff *skb, const struct pkt *p, __u32 l4_len,
				      struct tcp_reset_fields *r, __u16 *flags)
{
	struct tcphdr tcp;
	__u32 payload;

	if (bpf_skb_load_bytes(skb, p->l4_off, &tcp, sizeof(tcp)) < 0)
		return -1;
	if (tcp.doff * 4 > l4_len)
		return -1;
	payload = l4_len - tcp.doff * 4 + tcp.syn + tcp.fin;
	if (tcp.ack) {
		r->seq = tcp.ack_seq;
		r->ack_seq = 0;
		*flags = TCP_FLAG_RST;
	} else {
		r->seq = 0;
		r->ack_seq = bpf_htonl(bpf_ntohl(tcp.seq) + payload);
		*flags = TCP_FLAG_RST | TCP_FLAG_ACK;
	}
	return 0;
}

/*
 * Frames built on the stack start with two bytes of padding, so that the
 * IP header is 4-byte aligned; frame_len and frame_data skip them.
 */
#define frame_len(f) (sizeof(f) - 2)
#define frame_data(f) ((void *)&(f) + 2)

struct rst4 {
	__u8 pad[2];
	__u8 mac[12];
	__be16 eth_proto;
	struct iphdr ip;
	struct tcphdr tcp;
};

struct icmp4 {
	__u8 pad[2];
	__u8 mac[12];
	__be16 eth_proto;
	struct iphdr ip;
	struct icmphdr icmp;
	__u8 quote[28]; /* the offending IPv4 header and 8 bytes of L4 */
};

struct rst6 {
	__u8 pad[2];
	__u8 mac[12];
	__be16 eth_proto;
	struct ipv6hdr ip;
	struct tcphdr tcp;
};

struct icmp6 {
	__u8 pad[2];
	__u8 mac[12];
	__be16 eth_proto;
	struct ipv6hdr ip;
	struct icmp6hdr icmp;
	__u8 quote[48]; /* the offending IPv6 header and 8 bytes of L4 */
};

static __always_inline void swap_macs(struct __sk_buff *skb, __u8 *mac)
{
	__u8 orig[12];

	if (bpf_skb_load_bytes(skb, 0, orig, 12) < 0)
		__builtin_memset(orig, 0, 12);
	__builtin_memcpy(mac, orig + 6, 6);
	__builtin_memcpy(mac + 6, orig, 6);
}

static __always_inline __u16 ip4_csum(struct iphdr *ip)
{
	ip->check = 0;
	return csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0));
}

/* l4_csum is the checksum of an L4 header and data behind a pseudo-header. */
static __always_inline __u16 l4_csum(void *pseudo, __u32 pseudo_len, void *l4, __u32 l4_len)
{
	__s64 sum = bpf_csum_diff(NULL, 0, pseudo, pseudo_len, 0);

	return csum_fold(bpf_csum_diff(NULL, 0, l4, l4_len, (__u32)sum));
}

/* rst_header fills the TCP header of a RST answering the segment at p. */
static __always_inline void rst_header(struct tcphdr *tcp, const struct pkt *p, const struct tcp_reset_fields *f,
				       __u16 flags)
{
	tcp->source = p->dport;
	tcp->dest = p->sport;
	tcp->seq = f->seq;
	tcp->ack_seq = f->ack_seq;
	tcp->doff = 5;
	tcp->rst = 1;
	tcp->ack = !!(flags & TCP_FLAG_ACK);
}

/*
 * reject4 turns the IPv4 packet at p into a refusal sent back to its
 * sender: a TCP RST, or an ICMP port unreachable for UDP and SCTP.
 */
static __always_inline int reject4(struct __sk_buff *skb, const struct pkt *p)
{
	struct iphdr orig;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &orig, sizeof(orig)) < 0)
		return TC_ACT_SHOT;
	if (p->proto == IPPROTO_TCP) {
		struct rst4 r = {};
		struct pseudo4 ph = {};
		struct tcp_reset_fields f;
		__u16 flags;

		if (p->tcp_flags & TCP_FLAG_RST)
			return TC_ACT_SHOT; /* never answer a RST */
		if (rst_fields(skb, p, bpf_ntohs(orig.tot_len) - (p->l4_off - ETH_HLEN), &f, &flags) < 0)
			return TC_ACT_SHOT;
		swap_macs(skb, r.mac);
		r.eth_proto = bpf_htons(ETH_P_IP);
		r.ip.version = 4;
		r.ip.ihl = 5;
		r.ip.tot_len = bpf_htons(sizeof(r.ip) + sizeof(r.tcp));
		r.ip.ttl = 64;
		r.ip.protocol = IPPROTO_TCP;
		r.ip.saddr = orig.daddr;
		r.ip.daddr = orig.saddr;
		r.ip.check = ip4_csum(&r.ip);
		rst_header(&r.tcp, p, &f, flags);
		ph.saddr = r.ip.saddr;
		ph.daddr = r.ip.daddr;
		ph.proto = IPPROTO_TCP;
		ph.len = bpf_htons(sizeof(r.tcp));
		r.tcp.check = l4_csum(&ph, sizeof(ph), &r.tcp, sizeof(r.tcp));
		if (bpf_skb_change_tail(skb, frame_len(r), 0) < 0)
			return TC_ACT_SHOT;
		if (bpf_skb_store_bytes(skb, 0, frame_data(r), frame_len(r), BPF_F_RECOMPUTE_CSUM) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect(skb->ifindex, 0);
	} else {
		struct icmp4 m = {};

		if (orig.ihl != 5)
			return TC_ACT_SHOT; /* IP options: nothing to quote simply */
		if (bpf_skb_load_bytes(skb, ETH_HLEN, m.quote, sizeof(m.quote)) < 0)
			return TC_ACT_SHOT;
		swap_macs(skb, m.mac);
		m.eth_proto = bpf_htons(ETH_P_IP);
		m.ip.version = 4;
		m.ip.ihl = 5;
		m.ip.tot_len = bpf_htons(frame_len(m) - ETH_HLEN);
		m.ip.ttl = 64;
		m.ip.protocol = IPPROTO_ICMP;
		m.ip.saddr = orig.daddr;
		m.ip.daddr = orig.saddr;
		m.ip.check = ip4_csum(&m.ip);
		m.icmp.type = ICMP_DEST_UNREACH;
		m.icmp.code = ICMP_PORT_UNREACH;
		m.icmp.checksum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&m.icmp, sizeof(m.icmp) + sizeof(m.quote), 0));
		if (bpf_skb_change_tail(skb, frame_len(m), 0) < 0)
			return TC_ACT_SHOT;
		if (bpf_skb_store_bytes(skb, 0, frame_data(m), frame_len(m), BPF_F_RECOMPUTE_CSUM) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect(skb->ifindex, 0);
	}
}

/* reject6 is reject4 for IPv6: a TCP RST or an ICMPv6 port unreachable. */
static __always_inline int reject6(struct __sk_buff *skb, const struct pkt *p)
{
	struct ipv6hdr orig;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &orig, sizeof(orig)) < 0)
		return TC_ACT_SHOT;
	if (p->proto == IPPROTO_TCP) {
		struct rst6 r = {};
		struct pseudo6 ph = {};
		struct tcp_reset_fields f;
		__u16 flags;

		if (p->tcp_flags & TCP_FLAG_RST)
			return TC_ACT_SHOT;
		if (rst_fields(skb, p, bpf_ntohs(orig.payload_len), &f, &flags) < 0)
			return TC_ACT_SHOT;
		swap_macs(skb, r.mac);
		r.eth_proto = bpf_htons(ETH_P_IPV6);
		r.ip.version = 6;
		r.ip.payload_len = bpf_htons(sizeof(r.tcp));
		r.ip.nexthdr = IPPROTO_TCP;
		r.ip.hop_limit = 64;
		r.ip.saddr = orig.daddr;
		r.ip.daddr = orig.saddr;
		rst_header(&r.tcp, p, &f, flags);
		__builtin_memcpy(ph.saddr, &r.ip.saddr, 16);
		__builtin_memcpy(ph.daddr, &r.ip.daddr, 16);
		ph.len = bpf_htonl(sizeof(r.tcp));
		ph.nexthdr = IPPROTO_TCP;
		r.tcp.check = l4_csum(&ph, sizeof(ph), &r.tcp, sizeof(r.tcp));
		if (bpf_skb_change_tail(skb, frame_len(r), 0) < 0)
			return TC_ACT_SHOT;
		if (bpf_skb_store_bytes(skb, 0, frame_data(r), frame_len(r), BPF_F_RECOMPUTE_CSUM) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect(skb->ifindex, 0);
	} else {
		struct icmp6 m = {};
		struct pseudo6 ph = {};

		if (bpf_skb_load_bytes(skb, ETH_HLEN, m.quote, sizeof(m.quote)) < 0)
			return TC_ACT_SHOT;
		swap_macs(skb, m.mac);
		m.eth_proto = bpf_htons(ETH_P_IPV6);
		m.ip.version = 6;
		m.ip.payload_len = bpf_htons(sizeof(m.icmp) + sizeof(m.quote));
		m.ip.nexthdr = IPPROTO_ICMPV6;
		m.ip.hop_limit = 64;
		m.ip.saddr = orig.daddr;
		m.ip.daddr = orig.saddr;
		m.icmp.icmp6_type = ICMPV6_DEST_UNREACH;
		m.icmp.icmp6_code = ICMPV6_PORT_UNREACH;
		__builtin_memcpy(ph.saddr, &m.ip.saddr, 16);
		__builtin_memcpy(ph.daddr, &m.ip.daddr, 16);
		ph.len = bpf_htonl(sizeof(m.icmp) + sizeof(m.quote));
		ph.nexthdr = IPPROTO_ICMPV6;
		m.icmp.icmp6_cksum = l4_csum(&ph, sizeof(ph), &m.icmp, sizeof(m.icmp) + sizeof(m.quote));
		if (bpf_skb_change_tail(skb, frame_len(m), 0) < 0)
			return TC_ACT_SHOT;
		if (bpf_skb_store_bytes(skb, 0, frame_data(m), frame_len(m), BPF_F_RECOMPUTE_CSUM) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect(skb->ifindex, 0);
	}
}

static __always_inline int reject(struct __sk_buff *skb, const struct pkt *p)
{
	return p->is6 ? reject6(skb, p) : reject4(skb, p);
}

static __always_inline const struct config *config(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&vipd_config, &zero);
}

/* cfg_or is a lifetime of the config, or its default when unset. */
#define cfg_or(cfg, field, def) ((cfg) && (cfg)->field ? (cfg)->field : (def))

/* ct_lifetime is how long an entry lives after a packet with tcp_flags. */
static __always_inline __u32 ct_lifetime(const struct config *cfg, const struct pkt *p, struct ct_entry *e)
{
	if (p->proto != IPPROTO_TCP)
		return cfg_or(cfg, ct_other, CT_OTHER);
	if (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))
		e->flags |= CT_F_CLOSING;
	if (e->flags & CT_F_CLOSING)
		return cfg_or(cfg, ct_tcp_close, CT_TCP_CLOSE);
	if (!(e->flags & CT_F_SEEN_REPLY))
		return cfg_or(cfg, ct_tcp_syn, CT_TCP_SYN);
	return cfg_or(cfg, ct_tcp_established, CT_TCP_ESTABLISHED);
}

static __always_inline void ct_account(const struct config *cfg, struct __sk_buff *skb, const struct pkt *p,
				       struct ct_entry *e, __u32 now)
{
	__sync_fetch_and_add(&e->packets, 1);
	__sync_fetch_and_add(&e->bytes, skb->len);
	e->tcp_flags |= p->tcp_flags;
	e->expires = now + ct_lifetime(cfg, p, e);
}

/*
 * send_flow_event sends an event of the flow whose forward entry (fk, fwd) and
 * reply entry rev (NULL when unknown) are given. An event that does not fit
 * the ring is counted, never waited for: the packet goes on regardless.
 */
static __always_inline void send_flow_event(__u8 type, __u8 reason, const struct ct_key *fk,
					    const struct ct_entry *fwd, const struct ct_entry *rev)
{
	struct flow_event *ev = bpf_ringbuf_reserve(&vipd_events, sizeof(*ev), 0);

	if (!ev) {
		__u32 zero = 0;
		__u64 *drops = bpf_map_lookup_elem(&vipd_event_drops, &zero);

		if (drops)
			__sync_fetch_and_add(drops, 1);
		return;
	}
	ev->time_ns = type == FLOW_EV_NEW ? fwd->start_ns : bpf_ktime_get_ns();
	ev->flow_id = fwd->flow_id;
	ev->start_ns = fwd->start_ns;
	ev->orig_packets = fwd->packets;
	ev->orig_bytes = fwd->bytes;
	ev->reply_packets = rev ? rev->packets : 0;
	ev->reply_bytes = rev ? rev->bytes : 0;
	ev->client = fk->src;
	ev->vip = fk->dst;
	ev->backend = fwd->nat_addr;
	ev->client_port = fk->sport;
	ev->vip_port = fk->dport;
	ev->backend_port = fwd->nat_port;
	ev->proto = fk->proto;
	ev->type = type;
	ev->reason = reason;
	ev->pad[0] = 0;
	ev->pad[1] = 0;
	ev->pad[2] = 0;
	ev->backend_id = fwd->backend_id;
	/*
	 * Adaptive notification (no flags): the kernel wakes the reader only
	 * when this record is the first one unread, that is when the reader
	 * had read the ring to its end. A wakeup is an irq_work, a self-IPI,
	 * costly in a VM (FASTPATH.md, items 1 and 15), so it must not come
	 * per event: a reader that finds events lets the next ones gather for
	 * flowReadInterval before it looks again (dataplane/ebpf/flows.go),
	 * which makes it one wakeup per look while events come, none while
	 * the reader lags or there is none (a killed vipd), and an idle
	 * reader sleeps without a timer until the next event.
	 */
	bpf_ringbuf_submit(ev, 0);
}

/*
 * flow_closed sends the CLOSED event of a flow, unless one was sent
 * already: the flag is set atomically, so two CPUs seeing the FINs of both
 * sides at once report the flow once.
 */
static __always_inline void flow_closed(__u8 reason, const struct ct_key *fk, struct ct_entry *fwd,
					const struct ct_key *rk)
{
	if (fwd->ev_flags & CT_EV_CLOSED)
		return;
	if (__sync_fetch_and_or(&fwd->ev_flags, CT_EV_CLOSED) & CT_EV_CLOSED)
		return;
	send_flow_event(FLOW_EV_CLOSED, reason, fk, fwd, bpf_map_lookup_elem(&vipd_ct, rk));
}

static __always_inline __u8 tcp_close_reason(const struct pkt *p)
{
	return p->tcp_flags & TCP_FLAG_RST ? FLOW_CLOSE_RST : FLOW_CLOSE_FIN;
}

/* reply_key is the key of the reply entry of the flow whose forward entry
 * e the packet at p (before NAT) belongs to. */
static __always_inline void reply_key(struct ct_key *rk, const struct pkt *p, const struct ct_entry *e)
{
	__builtin_memset(rk, 0, sizeof(*rk));
	rk->src = e->nat_addr;
	rk->sport = e->nat_port;
	if (e->flags & CT_F_SNAT) {
		rk->dst = e->snat_addr;
		rk->dport = e->snat_port;
	} else {
		rk->dst = (e->flags & CT_F_HAIRPIN) ? p->dst : p->src;
		rk->dport = p->sport;
	}
	rk->proto = p->proto;
	rk->dir = CT_DIR_REPLY;
}

/* ct_drop_reply deletes the reply entry of the replaced flow whose forward
 * entry is old, if it is still that flow's (an SNAT reply entry may have
 * been reclaimed by a newer flow, snat_reclaim). rk is scratch. */
static __always_inline void ct_drop_reply(struct ct_key *rk, const struct pkt *p, const struct ct_entry *old)
{
	struct ct_entry *r;

	reply_key(rk, p, old);
	r = bpf_map_lookup_elem(&vipd_ct, rk);
	if (r && r->flow_id == old->flow_id)
		bpf_map_delete_elem(&vipd_ct, rk);
}

/* ct_src_slot finds the vipd_ct_srcs word and bit of a reply entry's
 * source (the backend's address and port); NULL when the map is missing. */
static __always_inline __u64 *ct_src_slot(const union addr *a, __be16 port, __u64 *bit)
{
	__u32 h = mix32(hash_addr(0x5bd1e995, a) ^ port) % CT_SRCS_BITS;
	__u32 word = h / 64;

	*bit = 1ULL << (h % 64);
	return bpf_map_lookup_elem(&vipd_ct_srcs, &word);
}

/* ct_src_mark records that reply entries may have the source a:port. */
static __always_inline void ct_src_mark(const union addr *a, __be16 port)
{
	__u64 bit, *w = ct_src_slot(a, port, &bit);

	/* Written only when the bit is new: the word stays shared, clean, in
	 * every CPU's cache. */
	if (w && !(*w & bit))
		__sync_fetch_and_or(w, bit);
}

/* ct_src_maybe reports whether a reply entry may have the source a:port:
 * when not, the packet is no reply of a tracked flow. */
static __always_inline int ct_src_maybe(const union addr *a, __be16 port)
{
	__u64 bit, *w = ct_src_slot(a, port, &bit);

	return !w || (*w & bit);
}

/* svc_addr_maybe reports whether a frontend may have the address a:port
 * for proto (vipd_svc_addrs): when not, the packet goes to no frontend.
 * The hash is svcFilterBit's in dataplane/ebpf. */
static __always_inline int svc_addr_maybe(const union addr *a, __be16 port, __u8 proto)
{
	/* One mix for all of it: this runs for every packet to a VIP. */
	__u32 h = mix32(0x27d4eb2f ^ a->w[0] ^ a->w[1] ^ a->w[2] ^ a->w[3] ^ ((__u32)port << 16 | proto)) %
		  SVC_ADDRS_BITS;
	__u32 word = h / 64;
	__u64 *w = bpf_map_lookup_elem(&vipd_svc_addrs, &word);

	return !w || (*w & (1ULL << (h % 64)));
}

/*
 * local_socket reports whether a socket of the node would take a packet
 * from src:sport to dst:dport (an established socket or a listener), so
 * that SNAT never hands out a port whose replies belong to a local socket.
 */
static __always_inline int local_socket(struct __sk_buff *skb, const struct pkt *p, const union addr *src,
					__be16 sport, const union addr *dst, __be16 dport)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 len;

	if (!p->is6) {
		t.ipv4.saddr = src->w[3];
		t.ipv4.daddr = dst->w[3];
		t.ipv4.sport = sport;
		t.ipv4.dport = dport;
		len = sizeof(t.ipv4);
	} else {
		__builtin_memcpy(t.ipv6.saddr, src->w, 16);
		__builtin_memcpy(t.ipv6.daddr, dst->w, 16);
		t.ipv6.sport = sport;
		t.ipv6.dport = dport;
		len = sizeof(t.ipv6);
	}
	if (p->proto == IPPROTO_TCP)
		sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	else if (p->proto == IPPROTO_UDP)
		sk = bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	else
		return 0;
	if (!sk)
		return 0;
	bpf_sk_release(sk);
	return 1;
}

/*
 * snat_reclaim frees the SNAT port of the reply entry at rk when its flow
 * is over: the entry expired and its forward entry is gone or expired too
 * (a one-way flow refreshes only its forward entry). The collector would
 * delete both later; until then the port would stay taken. It reports
 * whether the entry was deleted.
 */
static __always_inline int snat_reclaim(const struct ct_key *rk, __u32 now)
{
	struct ct_entry *old = bpf_map_lookup_elem(&vipd_ct, rk);
	struct ct_key fk = {};
	struct ct_entry *f;

	if (!old || (__s32)(old->expires - now) >= 0)
		return 0;
	fk.src = old->snat_addr;
	fk.sport = old->snat_port;
	fk.dst = old->nat_addr;
	fk.dport = old->nat_port;
	fk.proto = rk->proto;
	fk.dir = CT_DIR_FORWARD;
	f = bpf_map_lookup_elem(&vipd_ct, &fk);
	if (f && f->flow_id == old->flow_id && (__s32)(f->expires - now) >= 0)
		return 0;
	return bpf_map_delete_elem(&vipd_ct, rk) == 0;
}

/* ---- the backends' TIME_WAIT behind SNAT (vipd_snat_tw, maps.h) ---- */

/* snat_count adds one to the vipd_snat_stats slot (SNAT_STAT_*). */
static __always_inline void snat_count(__u32 slot)
{
	__u64 *c = bpf_map_lookup_elem(&vipd_snat_stats, &slot);

	if (c)
		*c += 1; /* per CPU: no other writer */
}

/* tcp_seg is what the TIME_WAIT guard needs of a TCP segment. */
struct tcp_seg {
	__u32 seq;    /* host order */
	__u32 end;    /* seq + payload + SYN + FIN: the sequence number after it */
	__u32 tsval;  /* the timestamp option's TSval, when has_ts */
	__u32 has_ts;
};

/*
 * snat_scratch is per-CPU room for the TIME_WAIT guard: vipd_from_ext's
 * stack is within a few bytes of the verifier's 512 at ct_create's port
 * search, too full for the SYN's fields. Only new SNAT TCP flows and the
 * closing segments of SNAT flows use it. Not pinned: nothing in it
 * outlives a packet.
 */
struct snat_scratch {
	struct tcp_seg seg; /* the segment tcp_seg_read read last */
	__u32 seg_ok;       /* ct_create: seg is the new flow's SYN */
	__s32 tw;           /* ct_create: snat_tw_refuses of the port tried last */
	__u32 buf;          /* tcp_seg_read's reads */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct snat_scratch);
} vipd_snat_scratch SEC(".maps");

static __always_inline struct snat_scratch *snat_scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&vipd_snat_scratch, &zero);
}

/* The most TCP option entries tcp_seg_read walks: Linux's SYN has five
 * (MSS, SACK permitted, timestamps, NOP, window scale), its other
 * segments three (NOP, NOP, timestamps). A timestamp option further on is
 * not seen: the segment counts as one without timestamps. */
#define TCP_OPT_WALK 16

/*
 * tcp_seg_read reads into sc->seg the sequence numbers of the TCP segment
 * at p and the TSval of its timestamp option, found by a bounded walk of
 * its options. Only SNAT SYNs and closing segments of SNAT flows (a few
 * per connection) come here: established segments never pay for it. It
 * returns -1 when the headers cannot be read (sc->seg is then unset).
 */
static __always_inline int tcp_seg_read(struct __sk_buff *skb, const struct pkt *p, struct snat_scratch *sc)
{
	__u8 *b = (__u8 *)&sc->buf;
	__u32 hlen, l4len, off, end, seq;
	int n;

	if (bpf_skb_load_bytes(skb, p->l4_off + 4, &sc->buf, 4) < 0)
		return -1;
	seq = bpf_ntohl(sc->buf);
	if (bpf_skb_load_bytes(skb, p->l4_off + 12, &sc->buf, 1) < 0)
		return -1;
	hlen = (b[0] >> 4) * 4;
	if (hlen < 20)
		return -1;
	/* IPv4's total length, IPv6's payload length (after its 40 bytes). */
	if (bpf_skb_load_bytes(skb, p->l3_off + (p->is6 ? 4 : 2), &sc->buf, 2) < 0)
		return -1;
	l4len = ((__u32)b[0] << 8 | b[1]) + (p->is6 ? 40 : 0) - (p->l4_off - p->l3_off);
	sc->seg.seq = seq;
	sc->seg.end = seq + (l4len > hlen ? l4len - hlen : 0) + !!(p->tcp_flags & TCP_FLAG_SYN) +
		      !!(p->tcp_flags & TCP_FLAG_FIN);
	sc->seg.tsval = 0;
	sc->seg.has_ts = 0;
	off = p->l4_off + 20;
	end = p->l4_off + hlen;
	for (n = 0; n < TCP_OPT_WALK; n++) {
		if (off + 2 > end || bpf_skb_load_bytes(skb, off, &sc->buf, 2) < 0)
			break;
		if (b[0] == 0) /* end of options */
			break;
		if (b[0] == 1) { /* NOP */
			off++;
			continue;
		}
		if (b[0] == 8 && b[1] == 10) {
			if (off + 10 <= end && bpf_skb_load_bytes(skb, off + 2, &sc->buf, 4) == 0) {
				sc->seg.tsval = bpf_ntohl(sc->buf);
				sc->seg.has_ts = 1;
			}
			break;
		}
		if (b[1] < 2)
			break;
		off += b[1];
	}
	return 0;
}

/*
 * snat_tw_refuses reports whether the backend's TIME_WAIT of the tuple rk,
 * if vipd_snat_tw remembers one younger than SNAT_TW_GUARD, would refuse
 * the new flow's SYN (in the scratch, when seg_ok), as Linux's
 * tcp_timewait_state_process decides: with timestamps on both, a SYN
 * whose TSval is older is refused (PAWS), a newer one taken; otherwise
 * (or with equal TSvals) it is taken only when its sequence number is
 * after the old flow's last one. It notes in the scratch's tw -1 when
 * there is no such record (or no SYN), 0 when the SYN would be taken, 1
 * when refused, and returns 1 when refused.
 */
static __always_inline int snat_tw_refuses(const struct ct_key *rk, __u32 now)
{
	struct snat_scratch *sc = snat_scratch();
	struct snat_tw *tw;
	__s32 d, r = 0;

	if (!sc)
		return 0;
	sc->tw = -1;
	if (!sc->seg_ok)
		return 0;
	tw = bpf_map_lookup_elem(&vipd_snat_tw, rk);
	if (!tw || (__u32)(now - tw->closed) >= SNAT_TW_GUARD)
		return 0;
	d = (__s32)(sc->seg.tsval - tw->tsval);
	if (sc->seg.has_ts && (tw->flags & SNAT_TW_F_TS) && d)
		r = d < 0;
	else
		r = (__s32)(sc->seg.seq - tw->next_seq) <= 0;
	sc->tw = r;
	return r;
}

/*
 * snat_tw_client notes a client segment of an SNAT TCP flow (forward entry
 * e, before this segment was accounted: seen its TCP flags, was_closing
 * its CT_F_CLOSING) that carries a FIN or RST or belongs to a closing
 * flow. A flow the backend closed first (the flow was closing before the
 * client's first FIN or RST) leaves the backend in TIME_WAIT: the client's
 * first FIN writes the record of the backend-side tuple, its later
 * segments (a FIN sent again, the last ACK) move it on. A client RST
 * drops it: the backend keeps no TIME_WAIT then. A flow the client closed
 * first gets none (the backend's side ends in LAST_ACK, not TIME_WAIT).
 */
static __always_inline void snat_tw_client(struct __sk_buff *skb, const struct pkt *p, const struct ct_entry *e,
					   __u8 seen, int was_closing, __u32 now)
{
	struct snat_scratch *sc;
	struct snat_tw *tw;
	struct ct_key rk;

	reply_key(&rk, p, e);
	if (p->tcp_flags & TCP_FLAG_RST) {
		bpf_map_delete_elem(&vipd_snat_tw, &rk);
		return;
	}
	if (was_closing && (p->tcp_flags & TCP_FLAG_FIN) && !(seen & (TCP_FLAG_FIN | TCP_FLAG_RST))) {
		/* The client's first FIN: a fresh record, whatever an older
		 * flow of the tuple left. */
		struct snat_tw v = {};

		sc = snat_scratch();
		if (!sc || tcp_seg_read(skb, p, sc) < 0)
			return;
		v.tsval = sc->seg.tsval;
		v.next_seq = sc->seg.end;
		v.closed = now;
		v.flags = sc->seg.has_ts ? SNAT_TW_F_TS : 0;
		bpf_map_update_elem(&vipd_snat_tw, &rk, &v, BPF_ANY);
		return;
	}
	/* Looked up first: a flow without a record reads nothing more. */
	tw = bpf_map_lookup_elem(&vipd_snat_tw, &rk);
	if (!tw)
		return;
	sc = snat_scratch();
	if (!sc || tcp_seg_read(skb, p, sc) < 0)
		return;
	if ((__s32)(sc->seg.end - tw->next_seq) > 0)
		tw->next_seq = sc->seg.end;
	if (sc->seg.has_ts && (__s32)(sc->seg.tsval - tw->tsval) > 0)
		tw->tsval = sc->seg.tsval;
	/* A FIN sent again restarts the TIME_WAIT. */
	tw->closed = now;
}

/*
 * ct_create records a new flow of the packet at p (not rewritten yet) to
 * backend b of frontend rev_nat_id: the forward entry (keyed as the client
 * sent it) and the reply entry (keyed as the backend answers), and reports
 * it. It fails, and the caller drops the packet, when either entry cannot
 * be stored: no flow is ever half-tracked (fail closed).
 *
 * old is the forward entry of a flow this one replaces (a client port
 * reused after its flow closed, FASTPATH.md 9), or NULL. Its entries are
 * rewritten in place rather than deleted and inserted again: the forward
 * entry always (its key is the packet's), the reply entry when the new
 * flow's has the same key (same backend, no SNAT). An LRU insert is the
 * dearest step of a new flow. No packet of the old flow can race the
 * writes: its client sends this SYN from that very tuple, so it has
 * finished with the old one.
 */
static __always_inline int ct_create(struct __sk_buff *skb, const struct ct_key *fk, const struct pkt *p,
				     const struct backend *b, __u32 backend_id, __u32 rev_nat_id,
				     const union addr *snat, __be16 *snat_port, struct ct_entry *old)
{
	struct ct_entry *f;
	/* Set when a map insert ran since the caller found old: an insert
	 * may evict (a full LRU evicts even referenced entries), so old is
	 * looked up again before it is written. */
	int inserted = 1;
	/* Looked up again rather than passed: that keeps vipd_from_pod's
	 * stack (near the verifier's 512 bytes) smaller. */
	const struct config *cfg = config();
	int hairpin = addr_eq(&b->addr, &p->src);
	/* One clock read for both: a read costs about 30 ns (FASTPATH.md). */
	__u64 start_ns = bpf_ktime_get_ns();
	__u32 now = (__u32)(start_ns / NSEC_PER_SEC);
	struct ct_entry e = {};
	struct ct_key rk;

	/* One entry on the stack, written as the reply entry, then turned
	 * into the forward one: vipd_from_pod's stack is close to the
	 * verifier's 512 bytes. */
	e.flags = hairpin ? CT_F_HAIRPIN : 0;
	e.backend_id = backend_id;
	e.rev_nat_id = rev_nat_id;
	e.created = now;
	e.ifindex = skb->ifindex;
	e.tcp_flags = p->tcp_flags;
	e.expires = now + ct_lifetime(cfg, p, &e);
	e.tcp_flags = 0;
	/* Random IDs need no shared counter; two live flows share one with
	 * odds of about n^2 / 2^65. */
	e.flow_id = (__u64)bpf_get_prandom_u32() << 32 | bpf_get_prandom_u32();
	e.flow_id |= !e.flow_id;
	e.start_ns = start_ns;
	e.nat_addr = p->dst;
	e.nat_port = p->dport;
	__builtin_memset(&rk, 0, sizeof(rk));
	rk.src = b->addr;
	rk.sport = b->port;
	rk.dst = hairpin ? p->dst : p->src;
	rk.dport = p->sport;
	rk.proto = p->proto;
	rk.dir = CT_DIR_REPLY;
	/* Before the reply entry exists: a reply must never find its bit
	 * clear. */
	ct_src_mark(&b->addr, b->port);
	if (snat) {
		if (old) {
			struct ct_key ork;

			ct_drop_reply(&ork, p, old);
		}
		/* The NAT table is the reply entries: a port is taken when its
		 * entry (backend -> node address:port) is inserted, atomically
		 * (BPF_NOEXIST), and is free again when the entry goes.
		 *
		 * The first try is a port of the client's own: its source
		 * port when SNAT may hand it out, else one its address and
		 * port hash to. A client tuple that comes back so gets the
		 * backend tuple it had, as with netfilter's NAT, and the
		 * backend's TIME_WAIT of that tuple takes the new SYN (its
		 * sequence numbers and timestamps follow the old ones); a
		 * new client would be refused there about half the time, so
		 * a port whose TIME_WAIT would refuse this SYN is skipped
		 * (vipd_snat_tw, maps.h). Then random ports. */
		__u32 lo = cfg_or(cfg, snat_port_min, SNAT_PORT_MIN);
		__u32 hi = cfg_or(cfg, snat_port_max, SNAT_PORT_MAX);
		__u32 slo = cfg ? cfg->snat_skip_min : 0, shi = cfg ? cfg->snat_skip_max : 0;
		__u32 skip = slo && shi >= slo && slo >= lo && shi <= hi ? shi - slo + 1 : 0;
		__u32 n = hi >= lo ? hi - lo + 1 : 1;
		__u32 cport = bpf_ntohs(p->sport), k;
		int i, ok = 0;
		struct snat_scratch *sc = snat_scratch();

		/* The SYN's sequence number and timestamp, for the guard of
		 * the backends' TIME_WAIT: read once, for new TCP flows only,
		 * into the scratch (the stack is full here). */
		if (sc) {
			sc->tw = -1;
			sc->seg_ok = p->proto == IPPROTO_TCP && tcp_seg_read(skb, p, sc) == 0;
		}

		if (skip >= n)
			skip = 0;
		n -= skip;
		if (cport >= lo && cport <= hi && !(skip && cport >= slo && cport <= shi))
			k = cport - lo - (skip && cport > shi ? skip : 0);
		else
			k = mix32(hash_addr(0x9e3779b9, &p->src) ^ cport) % n;
		e.flags = CT_F_SNAT;
		e.snat_addr = p->src;
		e.snat_port = p->sport;
		rk.dst = *snat;
		for (i = 0; i < SNAT_TRIES; i++) {
			__u32 port;
			struct ct_entry *old;

			if (i)
				k = bpf_get_prandom_u32() % n;
			port = lo + k;
			if (skip && port >= slo)
				port += skip;
			rk.dport = bpf_htons((__u16)port);
			if (local_socket(skb, p, &b->addr, b->port, snat, rk.dport))
				continue;
			/* A tuple whose TIME_WAIT at the backend would refuse
			 * this SYN is no port for it (vipd_snat_tw, maps.h). */
			if (snat_tw_refuses(&rk, now)) {
				snat_count(SNAT_STAT_TW_SKIPS);
				continue;
			}
			if (bpf_map_update_elem(&vipd_ct, &rk, &e, BPF_NOEXIST) == 0) {
				ok = 1;
				break;
			}
			/* Taken by this very client tuple to this frontend (a
			 * flow of it whose forward entry is gone): ours again. */
			old = bpf_map_lookup_elem(&vipd_ct, &rk);
			if (old && addr_eq(&old->snat_addr, &p->src) && old->snat_port == p->sport &&
			    addr_eq(&old->nat_addr, &p->dst) && old->nat_port == p->dport &&
			    bpf_map_update_elem(&vipd_ct, &rk, &e, BPF_ANY) == 0) {
				ok = 1;
				break;
			}
			if (snat_reclaim(&rk, now) && bpf_map_update_elem(&vipd_ct, &rk, &e, BPF_NOEXIST) == 0) {
				ok = 1;
				break;
			}
		}
		if (!ok) {
			snat_count(SNAT_STAT_EXHAUSTED);
			return -1;
		}
		/* The backend takes this SYN in place of its TIME_WAIT: the
		 * record is of no flow any more. */
		sc = snat_scratch();
		if (sc && sc->tw == 0)
			bpf_map_delete_elem(&vipd_snat_tw, &rk);
		*snat_port = rk.dport;
		e.snat_addr = *snat;
		e.snat_port = rk.dport;
	} else {
		struct ct_entry *r = NULL;

		/* The replaced flow's reply entry has this key when it had
		 * this backend and no SNAT (then the flow was hairpin exactly
		 * when this one is): rewritten in place. Otherwise it goes,
		 * and this one is inserted. */
		if (old && !(old->flags & CT_F_SNAT) && addr_eq(&old->nat_addr, &b->addr) && old->nat_port == b->port)
			r = bpf_map_lookup_elem(&vipd_ct, &rk);
		if (r) {
			*r = e;
			inserted = 0;
		} else {
			if (old) {
				struct ct_key ork;

				ct_drop_reply(&ork, p, old);
			}
			if (bpf_map_update_elem(&vipd_ct, &rk, &e, BPF_ANY) < 0)
				return -1;
		}
	}

	e.nat_addr = b->addr;
	e.nat_port = b->port;
	e.tcp_flags = p->tcp_flags;
	e.packets = 1;
	e.bytes = skb->len;
	f = old && inserted ? bpf_map_lookup_elem(&vipd_ct, fk) : old;
	if (f) {
		*f = e;
	} else if (bpf_map_update_elem(&vipd_ct, fk, &e, BPF_ANY) < 0) {
		bpf_map_delete_elem(&vipd_ct, &rk);
		return -1;
	}
	send_flow_event(FLOW_EV_NEW, 0, fk, &e, NULL);
	return 0;
}

/*
 * reusable tells whether a tracked flow keeps its backend. TCP and SCTP
 * flows keep it until they close, whatever happens to the backend (as
 * netfilter's conntrack keeps a DNAT); a new SYN on a closing or stale
 * entry, or one to a backend that may not take new connections, starts
 * afresh. UDP flows move when their backend left the service.
 */
/*
 * backend_is reports whether backend ID id still names the backend at
 * addr:port. Backend IDs are recycled (struct backend in maps.h): an ID a
 * flow was given may name another backend by now, even a member of the
 * same frontend, so membership of the ID alone does not tell that the
 * flow's backend is still listed. The lookup is of an array, which the
 * verifier inlines.
 */
static __always_inline int backend_is(__u32 id, const union addr *addr, __be16 port)
{
	struct backend *b = bpf_map_lookup_elem(&vipd_backends, &id);

	return b && b->used && b->port == port && addr_eq(&b->addr, addr);
}

/*
 * reusable tells whether a tracked flow keeps its backend. TCP and SCTP
 * flows keep it until they close, whatever happens to the backend (as
 * netfilter's conntrack keeps a DNAT); a new SYN on a closing or stale
 * entry, or one to a backend that may not take new connections, starts
 * afresh. UDP flows move when their backend left the service. A backend
 * is the entry's nat_addr:nat_port under its backend_id (backend_is): a
 * recycled ID is another backend.
 */
static __always_inline int reusable(const struct pkt *p, const struct ct_entry *e, __u32 now)
{
	int f;

	if ((__s32)(e->expires - now) < 0)
		return 0;
	/* Only a new SYN and UDP ask about the backend's membership: a TCP
	 * segment of a tracked flow costs no vipd_members or vipd_backends
	 * lookup (FASTPATH.md). */
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		if (e->flags & CT_F_CLOSING)
			return 0;
		if (!backend_is(e->backend_id, &e->nat_addr, e->nat_port))
			return 0;
		f = member_flags(e->rev_nat_id, e->backend_id);
		return f >= 0 && (f & MEMBER_F_ELIGIBLE);
	}
	if (p->proto == IPPROTO_UDP)
		return backend_is(e->backend_id, &e->nat_addr, e->nat_port) &&
		       member_flags(e->rev_nat_id, e->backend_id) >= 0;
	return 1;
}

/* replaced_reason is why a tracked flow that is not reusable ends. */
static __always_inline __u8 replaced_reason(const struct ct_entry *e, __u32 now)
{
	if ((__s32)(e->expires - now) < 0)
		return FLOW_CLOSE_TIMEOUT;
	if (!backend_is(e->backend_id, &e->nat_addr, e->nat_port) || member_flags(e->rev_nat_id, e->backend_id) < 0)
		return FLOW_CLOSE_BACKEND_REMOVED;
	return FLOW_CLOSE_REPLACED;
}

static __always_inline __u32 flow_hash(const struct pkt *p)
{
	__u32 h = hash_addr(0x9e3779b9, &p->src);

	h = hash_addr(h, &p->dst);
	return mix32(h ^ ((__u32)p->sport << 16 | p->dport) ^ p->proto);
}

/*
 * ttl_decrement does the forwarding's TTL (IPv4, header checksum updated)
 * or hop limit (IPv6) decrement for a packet that fib_redirect sends on
 * past the routing forward path. It returns 0 when done, 1 when the packet
 * has a TTL of 1 or less and must not be forwarded (left unchanged), and
 * -1 when the packet cannot be read or written.
 */
static __always_inline int ttl_decrement(struct __sk_buff *skb, const struct pkt *p)
{
	if (!p->is6) {
		__be16 old, new;
		__u8 *ttl = (__u8 *)&new;

		if (bpf_skb_load_bytes(skb, p->l3_off + 8, &old, 2) < 0) /* TTL, protocol */
			return -1;
		new = old;
		if (ttl[0] <= 1)
			return 1;
		ttl[0]--;
		if (bpf_l3_csum_replace(skb, p->l3_off + 10, old, new, 2) < 0)
			return -1;
		return bpf_skb_store_bytes(skb, p->l3_off + 8, &new, 2, 0) < 0 ? -1 : 0;
	} else {
		__u8 hops;

		if (bpf_skb_load_bytes(skb, p->l3_off + 7, &hops, 1) < 0)
			return -1;
		if (hops <= 1)
			return 1;
		hops--;
		return bpf_skb_store_bytes(skb, p->l3_off + 7, &hops, 1, BPF_F_RECOMPUTE_CSUM) < 0 ? -1 : 0;
	}
}

/*
 * fib_redirect sends the (rewritten) packet at p where the node's routes
 * take it, straight out of the egress interface: a packet whose source is
 * now a node address must not go through the routing input path, which
 * drops it as a martian (as Cilium does for node-port replies).
 */
static __always_inline int fib_redirect(struct __sk_buff *skb, const struct pkt *p)
{
	struct bpf_fib_lookup fib = {};
	int rc;

	/* A packet that may not be forwarded goes to the stack, which drops
	 * it or answers time exceeded: never out with TTL 0. */
	rc = ttl_decrement(skb, p);
	if (rc)
		return rc < 0 ? TC_ACT_SHOT : TC_ACT_OK;
	fib.ifindex = skb->ingress_ifindex ? skb->ingress_ifindex : skb->ifindex;
	fib.l4_protocol = p->proto;
	fib.sport = p->sport;
	fib.dport = p->dport;
	if (!p->is6) {
		fib.family = AF_INET;
		fib.ipv4_src = p->src.w[3];
		fib.ipv4_dst = p->dst.w[3];
	} else {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_src, p->src.w, 16);
		__builtin_memcpy(fib.ipv6_dst, p->dst.w, 16);
	}
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		if (bpf_skb_store_bytes(skb, 0, fib.dmac, 6, 0) < 0 || bpf_skb_store_bytes(skb, 6, fib.smac, 6, 0) < 0)
			return TC_ACT_SHOT;
		return bpf_redirect(fib.ifindex, 0);
	}
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(fib.ifindex, NULL, 0, 0);
	return TC_ACT_SHOT;
}

/* src_allowed reports whether src is in a frontend's source ranges. */
static __always_inline int src_allowed(__u32 rev_nat_id, const union addr *src)
{
	struct src_range_key k = {.prefixlen = 32 + 128, .rev_nat_id = rev_nat_id};

	k.addr = *src;
	return bpf_map_lookup_elem(&vipd_src_ranges, &k) != NULL;
}

/* snat_addr returns the node address SNAT uses on the interface a packet
 * entered, of the packet's family, or NULL. */
static __always_inline const union addr *snat_addr(struct __sk_buff *skb, const struct pkt *p)
{
	__u32 idx = skb->ifindex;
	struct ext_iface *x = bpf_map_lookup_elem(&vipd_ext_ifaces, &idx);
	const union addr *a;

	if (!x)
		return NULL;
	a = p->is6 ? &x->addr6 : &x->addr4;
	if (!a->w[0] && !a->w[1] && !a->w[2] && !a->w[3])
		return NULL;
	return a;
}

/* forward handles a packet to a frontend: tracked, new, or refused. */
static __always_inline int forward(struct __sk_buff *skb, struct pkt *p, const struct svc_key *sk,
				   const struct svc_val *svc, const int ext)
{
	const struct config *cfg = config();
	struct ct_key fk = {};
	struct ct_entry *e;
	struct backend b;
	union addr snat = {};
	__be16 snat_port = 0;
	__u32 now = 0, id;
	int hairpin, snatted = 0;

	fk.src = p->src;
	fk.dst = p->dst;
	fk.sport = p->sport;
	fk.dport = p->dport;
	fk.proto = p->proto;
	fk.dir = CT_DIR_FORWARD;

	e = bpf_map_lookup_elem(&vipd_ct, &fk);
	/* The clock only for a tracked tuple: a new flow's is read once, by
	 * ct_create (FASTPATH.md 12). */
	if (e)
		now = now_sec();
	if (e && reusable(p, e, now)) {
		/* As they were before this packet, for snat_tw_client. */
		__u8 seen = e->tcp_flags;
		int was_closing = e->flags & CT_F_CLOSING;

		ct_account(cfg, skb, p, e, now);
		b.addr = e->nat_addr;
		b.port = e->nat_port;
		hairpin = e->flags & CT_F_HAIRPIN;
		if (e->flags & CT_F_SNAT) {
			snatted = 1;
			snat = e->snat_addr;
			snat_port = e->snat_port;
		}
		if (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) {
			struct ct_key rk;

			reply_key(&rk, p, e);
			flow_closed(tcp_close_reason(p), &fk, e, &rk);
		}
		/* Only the closing segments of SNAT TCP flows: established
		 * ones pay nothing more. */
		if (ext && snatted && p->proto == IPPROTO_TCP &&
		    (was_closing || (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))))
			snat_tw_client(skb, p, e, seen, was_closing, now);
	} else {
		struct backend *bp = NULL;
		const union addr *a = NULL;
		int verdict = TC_ACT_SHOT, ended = 1;

		if (e) {
			/* Replaced: the old flow ends here (unless it was seen
			 * to close already). Its reply entry goes with it, or
			 * is rewritten in place by ct_create. */
			struct ct_key rk;

			reply_key(&rk, p, e);
			flow_closed(replaced_reason(e, now), &fk, e, &rk);
		}
		if (svc->flags & SVC_F_DRAINING) {
			verdict = TC_ACT_OK; /* a deleted service: as if there were none */
		} else if (svc->count == 0) {
			verdict = svc->flags & SVC_F_DROP_EMPTY ? TC_ACT_SHOT : reject(skb, p);
		} else if (p->proto == IPPROTO_TCP && !(p->tcp_flags & TCP_FLAG_SYN)) {
			/* A mid-stream segment of a flow that is not tracked
			 * (never seen, or idle past its lifetime): refuse it
			 * rather than guess a backend. */
			verdict = reject(skb, p);
		} else {
			id = select_backend(sk, svc, &p->src, flow_hash(p));
			bp = id ? bpf_map_lookup_elem(&vipd_backends, &id) : NULL;
			if (bp && !bp->used)
				bp = NULL; /* a free slot: no backend */
			if (bp && ext && (svc->flags & SVC_F_SNAT))
				a = snat_addr(skb, p);
			ended = !bp || (ext && (svc->flags & SVC_F_SNAT) && !a);
		}
		if (ended) {
			if (e) {
				struct ct_key rk;

				ct_drop_reply(&rk, p, e);
			}
			return verdict;
		}
		b = *bp;
		hairpin = addr_eq(&b.addr, &p->src);
		if (a) {
			snat = *a;
			snatted = 1;
			hairpin = 0;
			if (ct_create(skb, &fk, p, &b, id, svc->rev_nat_id, &snat, &snat_port, e) < 0)
				return TC_ACT_SHOT;
		} else if (ct_create(skb, &fk, p, &b, id, svc->rev_nat_id, NULL, NULL, e) < 0) {
			return TC_ACT_SHOT;
		}
	}
	if (ext && snatted) {
		if (rewrite(skb, p, SIDE_DST, &b.addr, b.port) < 0 || rewrite(skb, p, SIDE_SRC, &snat, snat_port) < 0)
			return TC_ACT_SHOT;
		return fib_redirect(skb, p);
	}
	if (hairpin) {
		union addr vip = p->dst;

		if (rewrite(skb, p, SIDE_DST, &b.addr, b.port) < 0 ||
		    rewrite(skb, p, SIDE_SRC, &vip, p->sport) < 0)
			return TC_ACT_SHOT;
		return bounce(skb);
	}
	if (rewrite(skb, p, SIDE_DST, &b.addr, b.port) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

/* What reverse translates: replies of plain flows, hairpin flows, and SNAT
 * flows. */
#define REV_PLAIN 1
#define REV_HAIRPIN 2
#define REV_SNAT 4

/*
 * reverse translates a reply of a tracked flow back to the VIP, if it is
 * of a kind in accept. Hairpin replies are translated on the way in, where
 * they are also sent straight back to the pod; SNAT replies on the way in
 * (from a local backend's pod interface or, from a remote one, the
 * external interface), where they are sent straight out to the client;
 * others on the way out to the client.
 */
static __always_inline int reverse(struct __sk_buff *skb, struct pkt *p, const int accept, int *done)
{
	const struct config *cfg;
	struct ct_key rk = {};
	struct ct_entry *e;
	__u32 now;
	union addr vip;
	__be16 vport;
	int hairpin, snatted, kind;

	*done = 0;
	/* Most packets are no reply of a tracked flow: the filter says so
	 * without touching the conntrack table (FASTPATH.md). */
	if (!ct_src_maybe(&p->src, p->sport))
		return TC_ACT_OK;
	rk.src = p->src;
	rk.dst = p->dst;
	rk.sport = p->sport;
	rk.dport = p->dport;
	rk.proto = p->proto;
	rk.dir = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(&vipd_ct, &rk);
	if (!e)
		return TC_ACT_OK;
	now = now_sec(); /* only for packets that found an entry */
	hairpin = e->flags & CT_F_HAIRPIN;
	snatted = e->flags & CT_F_SNAT;
	kind = snatted ? REV_SNAT : hairpin ? REV_HAIRPIN : REV_PLAIN;
	if (!(accept & kind)) {
		/* A live reply of a tracked flow, translated elsewhere: it goes
		 * on as it is, with no frontend lookup (a reply is never a new
		 * flow to a frontend). This is most replies on vipd_from_pod
		 * (FASTPATH.md). */
		*done = (__s32)(e->expires - now) >= 0;
		return TC_ACT_OK;
	}
	/* An expired entry not yet collected must not capture a new flow
	 * that reuses the tuple (say, a direct connection from the same
	 * client port). Replies keep it in step with its forward entry. */
	if (p->proto == IPPROTO_TCP && (__s32)(e->expires - now) < 0)
		return TC_ACT_OK;
	vip = e->nat_addr;
	vport = e->nat_port;

	/* Keep the forward entry alive and mark the flow as answered. A
	 * reply entry lives as long as its flow, whose expiry is the forward
	 * entry's (on one-way traffic the reply entry's own lags behind). */
	{
		struct ct_key fk = {};
		struct ct_entry *f;

		fk.src = hairpin ? p->src : p->dst;
		fk.sport = p->dport;
		if (snatted) {
			fk.src = e->snat_addr;
			fk.sport = e->snat_port;
		}
		fk.dst = vip;
		fk.dport = vport;
		fk.proto = p->proto;
		fk.dir = CT_DIR_FORWARD;
		f = bpf_map_lookup_elem(&vipd_ct, &fk);
		if (p->proto != IPPROTO_TCP && (!f || (__s32)(f->expires - now) < 0))
			return TC_ACT_OK;
		cfg = config();
		ct_account(cfg, skb, p, e, now);
		if (f) {
			if (!(f->flags & CT_F_SEEN_REPLY))
				f->flags |= CT_F_SEEN_REPLY;
			if (p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) {
				f->flags |= CT_F_CLOSING;
				flow_closed(tcp_close_reason(p), &fk, f, &rk);
			}
			f->expires = e->expires;
			if (p->proto == IPPROTO_TCP && !(f->flags & CT_F_CLOSING))
				f->expires = now + cfg_or(cfg, ct_tcp_established, CT_TCP_ESTABLISHED);
			e->expires = f->expires;
		}
	}
	*done = 1;
	if (snatted) {
		union addr client = e->snat_addr;
		__be16 cport = e->snat_port;

		if (rewrite(skb, p, SIDE_SRC, &vip, vport) < 0 || rewrite(skb, p, SIDE_DST, &client, cport) < 0)
			return TC_ACT_SHOT;
		return fib_redirect(skb, p);
	}
	if (hairpin) {
		union addr client = p->src;

		if (rewrite(skb, p, SIDE_SRC, &vip, vport) < 0 || rewrite(skb, p, SIDE_DST, &client, p->dport) < 0)
			return TC_ACT_SHOT;
		return bounce(skb);
	}
	if (rewrite(skb, p, SIDE_SRC, &vip, vport) < 0)
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

/* ---- ICMP errors about tracked flows ---- */

#define ICMP_TIME_EXCEEDED 11
#define ICMP_PARAMETERPROB 12

/* icmp_quote is what the packet path knows about an ICMP or ICMPv6 error
 * and the packet it quotes. */
struct icmp_quote {
	union addr osrc; /* the error's own addresses */
	union addr odst;
	union addr src; /* the quoted packet's */
	union addr dst;
	__be16 sport;
	__be16 dport;
	__u32 icmp_off; /* ICMP header */
	__u32 in_off;   /* quoted IP header */
	__u32 in_l4_off;
	__u8 proto; /* the quoted packet's L4 protocol */
	__u8 is6;
};

/*
 * parse_icmp_error fills q for an ICMP destination unreachable (which
 * includes fragmentation needed), time exceeded or parameter problem, or
 * their ICMPv6 counterparts (packet too big too), that quotes a TCP, UDP
 * or SCTP packet; it returns -1 for anything else.
 */
static __always_inline int parse_icmp_error(struct __sk_buff *skb, struct icmp_quote *q)
{
	__be16 eth_proto, ports[2];
	__u8 type;

	if (bpf_skb_load_bytes(skb, 12, &eth_proto, 2) < 0)
		return -1;
	if (eth_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return -1;
		if (ip.version != 4 || ip.ihl < 5 || ip.protocol != IPPROTO_ICMP ||
		    (ip.frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return -1;
		q->is6 = 0;
		addr_from4(&q->osrc, ip.saddr);
		addr_from4(&q->odst, ip.daddr);
		q->icmp_off = ETH_HLEN + ip.ihl * 4;
		if (bpf_skb_load_bytes(skb, q->icmp_off, &type, 1) < 0)
			return -1;
		if (type != ICMP_DEST_UNREACH && type != ICMP_TIME_EXCEEDED && type != ICMP_PARAMETERPROB)
			return -1;
		q->in_off = q->icmp_off + sizeof(struct icmphdr);
		if (bpf_skb_load_bytes(skb, q->in_off, &ip, sizeof(ip)) < 0)
			return -1;
		if (ip.version != 4 || ip.ihl < 5 || (ip.frag_off & bpf_htons(IP_OFFSET)))
			return -1;
		q->proto = ip.protocol;
		addr_from4(&q->src, ip.saddr);
		addr_from4(&q->dst, ip.daddr);
		q->in_l4_off = q->in_off + ip.ihl * 4;
	} else if (eth_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return -1;
		if (ip6.nexthdr != IPPROTO_ICMPV6)
			return -1;
		q->is6 = 1;
		__builtin_memcpy(q->osrc.b, ip6.saddr.s6_addr, 16);
		__builtin_memcpy(q->odst.b, ip6.daddr.s6_addr, 16);
		q->icmp_off = ETH_HLEN + sizeof(ip6);
		if (bpf_skb_load_bytes(skb, q->icmp_off, &type, 1) < 0)
			return -1;
		if (type != ICMPV6_DEST_UNREACH && type != ICMPV6_PKT_TOOBIG && type != ICMPV6_TIME_EXCEED &&
		    type != ICMPV6_PARAMPROB)
			return -1;
		q->in_off = q->icmp_off + sizeof(struct icmp6hdr);
		if (bpf_skb_load_bytes(skb, q->in_off, &ip6, sizeof(ip6)) < 0)
			return -1;
		q->proto = ip6.nexthdr;
		__builtin_memcpy(q->src.b, ip6.saddr.s6_addr, 16);
		__builtin_memcpy(q->dst.b, ip6.daddr.s6_addr, 16);
		q->in_l4_off = q->in_off + sizeof(ip6);
	} else {
		return -1;
	}
	if (q->proto != IPPROTO_TCP && q->proto != IPPROTO_UDP && q->proto != IPPROTO_SCTP)
		return -1;
	if (bpf_skb_load_bytes(skb, q->in_l4_off, ports, sizeof(ports)) < 0)
		return -1;
	q->sport = ports[0];
	q->dport = ports[1];
	return 0;
}

/* Which address of an ICMP error icmp_set_addr replaces. */
#define ICMP_OUTER_SRC 0
#define ICMP_OUTER_DST 1
#define ICMP_INNER_SRC 2
#define ICMP_INNER_DST 3

/*
 * icmp_set_addr replaces an address of the ICMP error q (one of
 * ICMP_OUTER_* and ICMP_INNER_*), keeping its checksums right: the outer
 * IPv4 header's, the quoted IPv4 header's (whose sum, checksum included,
 * stays the same, so the ICMP checksum does too), and the ICMPv6 checksum,
 * which covers the outer addresses (pseudo-header) and the quoted ones.
 * The quoted TCP or UDP checksum is left alone: receivers of an error do
 * not check it (the quote is often cut short before it), and updating it
 * here would take stack that vipd_from_pod does not have to spare.
 */
static __always_inline int icmp_set_addr(struct __sk_buff *skb, struct icmp_quote *q, const int which,
					 const union addr *to)
{
	int inner = which == ICMP_INNER_SRC || which == ICMP_INNER_DST;
	int dst = which == ICMP_OUTER_DST || which == ICMP_INNER_DST;
	union addr *from = which == ICMP_OUTER_SRC ? &q->osrc : which == ICMP_OUTER_DST ? &q->odst
							 : which == ICMP_INNER_SRC ? &q->src : &q->dst;
	__u32 l3 = inner ? q->in_off : ETH_HLEN;

	if (addr_eq(from, to))
		return 0;
	if (!q->is6) {
		if (bpf_l3_csum_replace(skb, l3 + 10, from->w[3], to->w[3], 4) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, l3 + (dst ? 16 : 12), &to->w[3], 4, 0) < 0)
			return -1;
	} else {
		__s64 diff = bpf_csum_diff(from->w, 16, (__be32 *)to->w, 16, 0);

		if (bpf_l4_csum_replace(skb, q->icmp_off + 2, 0, diff, inner ? 0 : BPF_F_PSEUDO_HDR) < 0)
			return -1;
		if (bpf_skb_store_bytes(skb, l3 + (dst ? 24 : 8), to->b, 16, inner ? 0 : BPF_F_RECOMPUTE_CSUM) < 0)
			return -1;
	}
	*from = *to;
	return 0;
}

/* icmp_set_port replaces the quoted packet's source (dst 0) or destination
 * port, and the ICMP checksum with it. */
static __always_inline int icmp_set_port(struct __sk_buff *skb, struct icmp_quote *q, const int dst, __be16 to)
{
	__be16 *from = dst ? &q->dport : &q->sport;

	if (*from == to)
		return 0;
	if (bpf_l4_csum_replace(skb, q->icmp_off + 2, *from, to, 2) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, q->in_l4_off + (dst ? 2 : 0), &to, 2, 0) < 0)
		return -1;
	*from = to;
	return 0;
}

/* icmp_forward sends a translated error of an SNAT flow on the way its
 * flow's packets go (fib_redirect): its source may be a node address now,
 * which the routing input path would drop as a martian. */
static __always_inline int icmp_forward(struct __sk_buff *skb, const struct icmp_quote *q)
{
	struct pkt p = {};

	p.src = q->osrc;
	p.dst = q->odst;
	p.proto = q->is6 ? IPPROTO_ICMPV6 : IPPROTO_ICMP;
	p.is6 = q->is6;
	p.l3_off = ETH_HLEN;
	return fib_redirect(skb, &p);
}

/*
 * icmp_related translates an ICMP error that quotes a packet of a tracked
 * flow, as netfilter does with the errors of a NATed connection (RELATED),
 * so that path MTU discovery and the errors of far ends work through
 * vipd's NAT. out tells egress (1) from ingress (0); rev, the reverse kinds
 * of the interface (see reverse). Anything else passes untouched.
 *
 *   In, quoting node:port -> backend (an SNAT flow's packet, from a router
 *   on the backend's side, or the backend): to the client, quoting
 *   client -> frontend; sent on as the flow's replies are.
 *   In, quoting frontend -> client (a reply as the client saw it, from a
 *   router on the client's side, or the client): to the backend, quoting
 *   backend -> client, or backend -> node:port for an SNAT flow.
 *   Out, quoting client -> backend (a flow whose client address is kept:
 *   the node's own error, or the backend's, on its way to the client):
 *   quoting client -> frontend.
 *
 * As with netfilter, the error's source becomes the one the flow's packets
 * have on that way: the frontend towards the client, the node's SNAT
 * address towards the backend of an SNAT flow (a Local flow's backend gets
 * the error as sent). The sender's own address is lost, as it is with
 * netfilter; the quote is what the receiver's stack acts on.
 */
static __always_inline int icmp_related(struct __sk_buff *skb, const int rev, const int out)
{
	struct icmp_quote q = {};
	struct ct_key k = {};
	struct ct_entry *e;

	if (parse_icmp_error(skb, &q) < 0)
		return TC_ACT_OK;
	/* First: is the quoted packet one the reply entry's packets answer? */
	k.src = q.dst;
	k.sport = q.dport;
	k.dst = q.src;
	k.dport = q.sport;
	k.proto = q.proto;
	k.dir = CT_DIR_REPLY;
	e = bpf_map_lookup_elem(&vipd_ct, &k);
	if (e) {
		if (e->flags & CT_F_HAIRPIN)
			return TC_ACT_OK;
		if (!out && (e->flags & CT_F_SNAT) && (rev & REV_SNAT) && addr_eq(&q.odst, &q.src)) {
			if (icmp_set_addr(skb, &q, ICMP_INNER_SRC, &e->snat_addr) < 0 ||
			    icmp_set_port(skb, &q, 0, e->snat_port) < 0 ||
			    icmp_set_addr(skb, &q, ICMP_OUTER_DST, &e->snat_addr) < 0 ||
			    icmp_set_addr(skb, &q, ICMP_INNER_DST, &e->nat_addr) < 0 ||
			    icmp_set_port(skb, &q, 1, e->nat_port) < 0 ||
			    icmp_set_addr(skb, &q, ICMP_OUTER_SRC, &e->nat_addr) < 0)
				return TC_ACT_SHOT;
			return icmp_forward(skb, &q);
		}
		if (out && !(e->flags & CT_F_SNAT) && (rev & REV_PLAIN)) {
			if (icmp_set_addr(skb, &q, ICMP_INNER_DST, &e->nat_addr) < 0 ||
			    icmp_set_port(skb, &q, 1, e->nat_port) < 0 ||
			    icmp_set_addr(skb, &q, ICMP_OUTER_SRC, &e->nat_addr) < 0)
				return TC_ACT_SHOT;
		}
		return TC_ACT_OK;
	}
	if (out)
		return TC_ACT_OK;
	/* Then: is it a reply as the client saw it (the forward entry's
	 * packets answer it), sent back to the frontend? */
	k.dir = CT_DIR_FORWARD;
	e = bpf_map_lookup_elem(&vipd_ct, &k);
	if (!e || (e->flags & CT_F_HAIRPIN) || !addr_eq(&q.odst, &q.src))
		return TC_ACT_OK;
	if (icmp_set_addr(skb, &q, ICMP_INNER_SRC, &e->nat_addr) < 0 || icmp_set_port(skb, &q, 0, e->nat_port) < 0 ||
	    icmp_set_addr(skb, &q, ICMP_OUTER_DST, &e->nat_addr) < 0)
		return TC_ACT_SHOT;
	if (!(e->flags & CT_F_SNAT))
		return TC_ACT_OK; /* the stack routes it, as the flow's packets */
	if (icmp_set_addr(skb, &q, ICMP_INNER_DST, &e->snat_addr) < 0 || icmp_set_port(skb, &q, 1, e->snat_port) < 0 ||
	    icmp_set_addr(skb, &q, ICMP_OUTER_SRC, &e->snat_addr) < 0)
		return TC_ACT_SHOT;
	return icmp_forward(skb, &q);
}

/* ingress is the way in of the pods' and the external interfaces' packets:
 * replies translated back (the reverse kinds rev), then a new or known
 * flow to a frontend of scope (SCOPE_CLUSTER for pods, SCOPE_EXTERNAL for
 * the external interfaces) checked against its source ranges and
 * forwarded. */
static __always_inline int ingress(struct __sk_buff *skb, int rev, __u8 scope)
{
	struct svc_key sk = {};
	struct svc_val *svc;
	struct pkt p = {};
	int ret, done;

	if (parse(skb, &p) < 0)
		return icmp_related(skb, rev, 0);
	ret = reverse(skb, &p, rev, &done);
	if (done)
		return ret;
	/* Most packets are for no frontend: the filter says so without
	 * touching vipd_services (FASTPATH.md). */
	if (!svc_addr_maybe(&p.dst, p.dport, p.proto))
		return TC_ACT_OK;
	sk.addr = p.dst;
	sk.port = p.dport;
	sk.proto = p.proto;
	sk.scope = scope;
	svc = bpf_map_lookup_elem(&vipd_services, &sk);
	if (!svc)
		return TC_ACT_OK;
	if ((svc->flags & SVC_F_SRC_RANGES) && !src_allowed(svc->rev_nat_id, &p.src))
		return TC_ACT_SHOT;
	return forward(skb, &p, &sk, svc, scope == SCOPE_EXTERNAL);
}

SEC("tc")
int vipd_from_pod(struct __sk_buff *skb)
{
	return ingress(skb, REV_HAIRPIN | REV_SNAT, SCOPE_CLUSTER);
}

/* egress is the way out to the pods and the external interfaces: replies
 * translated back (the reverse kinds rev), nothing else. */
static __always_inline int egress(struct __sk_buff *skb, int rev)
{
	struct pkt p = {};
	int done;

	if (parse(skb, &p) < 0)
		return icmp_related(skb, rev, 1);
	return reverse(skb, &p, rev, &done);
}

SEC("tc")
int vipd_to_pod(struct __sk_buff *skb)
{
	return egress(skb, REV_PLAIN | REV_HAIRPIN);
}

SEC("tc")
int vipd_from_ext(struct __sk_buff *skb)
{
	return ingress(skb, REV_SNAT, SCOPE_EXTERNAL);
}

SEC("tc")
int vipd_to_ext(struct __sk_buff *skb)
{
	return egress(skb, REV_PLAIN);
}

/* ---- socket-level load balancing for the node's own processes ---- */

static __always_inline int in_host_netns(struct bpf_sock_addr *ctx)
{
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&vipd_config, &zero);

	return cfg && cfg->host_netns_cookie && cfg->host_netns_cookie == bpf_get_netns_cookie(ctx);
}

static __always_inline int sock_proto(struct bpf_sock_addr *ctx)
{
	if (ctx->type == 1 /* SOCK_STREAM */ && (ctx->protocol == IPPROTO_TCP || ctx->protocol == 0))
		return IPPROTO_TCP;
	if (ctx->type == 2 /* SOCK_DGRAM */ && (ctx->protocol == IPPROTO_UDP || ctx->protocol == 0))
		return IPPROTO_UDP;
	if (ctx->protocol == IPPROTO_SCTP)
		return IPPROTO_SCTP;
	return 0;
}

static __always_inline void sock_addr_get(struct bpf_sock_addr *ctx, int v6, union addr *a)
{
	if (!v6) {
		addr_from4(a, ctx->user_ip4);
		return;
	}
	a->w[0] = ctx->user_ip6[0];
	a->w[1] = ctx->user_ip6[1];
	a->w[2] = ctx->user_ip6[2];
	a->w[3] = ctx->user_ip6[3];
}

static __always_inline int sock_addr_set(struct bpf_sock_addr *ctx, int v6, const union addr *a)
{
	if (!v6) {
		if (!addr_is4(a))
			return -1;
		ctx->user_ip4 = a->w[3];
		return 0;
	}
	ctx->user_ip6[0] = a->w[0];
	ctx->user_ip6[1] = a->w[1];
	ctx->user_ip6[2] = a->w[2];
	ctx->user_ip6[3] = a->w[3];
	return 0;
}

/*
 * sock_src_allowed applies a frontend's source ranges to a node-local
 * socket: to its source address when the socket is bound (or sendmsg names
 * one), else to the node's addresses, one of which the kernel picks
 * (SVC_F_NODE_ALLOWED).
 */
static __always_inline int sock_src_allowed(struct bpf_sock_addr *ctx, int v6, int sendmsg, const struct svc_val *svc)
{
	union addr src = {};
	struct bpf_sock *sk = ctx->sk;

	if (!v6) {
		__u32 a = sendmsg ? ctx->msg_src_ip4 : 0;

		if (!a && sk)
			a = sk->src_ip4;
		if (a) {
			addr_from4(&src, a);
			return src_allowed(svc->rev_nat_id, &src);
		}
	} else {
		if (sendmsg) {
			src.w[0] = ctx->msg_src_ip6[0];
			src.w[1] = ctx->msg_src_ip6[1];
			src.w[2] = ctx->msg_src_ip6[2];
			src.w[3] = ctx->msg_src_ip6[3];
		}
		if (!src.w[0] && !src.w[1] && !src.w[2] && !src.w[3] && sk) {
			src.w[0] = sk->src_ip6[0];
			src.w[1] = sk->src_ip6[1];
			src.w[2] = sk->src_ip6[2];
			src.w[3] = sk->src_ip6[3];
		}
		if (src.w[0] || src.w[1] || src.w[2] || src.w[3])
			return src_allowed(svc->rev_nat_id, &src);
	}
	return !!(svc->flags & SVC_F_NODE_ALLOWED);
}

/*
 * sock_translate rewrites the destination of a connect() or sendmsg() to a
 * VIP into a backend, and remembers the backend so that replies and
 * getpeername() show the VIP. With no usable backend it refuses the call
 * with ECONNREFUSED.
 */
static __always_inline int sock_translate(struct bpf_sock_addr *ctx, int v6, int sendmsg)
{
	struct svc_key sk = {};
	struct svc_val *svc;
	struct backend *b;
	struct sock_key k = {};
	struct sock_val v = {};
	union addr client = {};
	__u64 cookie, netns;
	__u32 id;
	int proto;

	if (!in_host_netns(ctx))
		return 1;
	proto = sock_proto(ctx);
	if (!proto)
		return 1;
	sock_addr_get(ctx, v6, &sk.addr);
	sk.port = (__be16)ctx->user_port;
	sk.proto = proto;
	svc = bpf_map_lookup_elem(&vipd_services, &sk);
	if (!svc || (svc->flags & SVC_F_DRAINING))
		return 1;
	/* A source outside a load-balancer IP's source ranges is refused with
	 * EPERM: the socket's equivalent of the packets' drop. */
	if ((svc->flags & SVC_F_SRC_RANGES) && !sock_src_allowed(ctx, v6, sendmsg, svc))
		return 0;
	if (svc->count == 0) {
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	cookie = bpf_get_socket_cookie(ctx);
	netns = bpf_get_netns_cookie(ctx);
	/* The client of a node-local socket is its network namespace. */
	client.w[0] = (__u32)netns;
	client.w[1] = (__u32)(netns >> 32);
	id = 0;
	if (sendmsg) {
		/* An unconnected socket's datagrams to a VIP stay on one backend
		 * while it is listed and the exchange is not idle, as a UDP
		 * conntrack entry would keep them. The entry holds only the
		 * backend ID, and the address is read from its slot below: a
		 * recycled ID that is a member again sends the datagrams to
		 * the member that holds it now, never to a removed backend
		 * (as a fresh pick could have). */
		struct sock_udp_key uk = {.cookie = cookie, .vip = sk.addr, .port = sk.port};
		struct sock_udp_val *uv = bpf_map_lookup_elem(&vipd_sock_udp, &uk);
		__u32 now = now_sec();

		if (uv && now - uv->last_used <= cfg_or(config(), ct_other, CT_OTHER) &&
		    member_flags(svc->rev_nat_id, uv->backend_id) >= 0) {
			id = uv->backend_id;
			uv->last_used = now;
		} else {
			id = select_backend(&sk, svc, &client, mix32((__u32)cookie ^ (__u32)(cookie >> 32)));
			if (id) {
				struct sock_udp_val nv = {.backend_id = id, .last_used = now};

				bpf_map_update_elem(&vipd_sock_udp, &uk, &nv, BPF_ANY);
			}
		}
	} else {
		id = select_backend(&sk, svc, &client, mix32((__u32)cookie ^ (__u32)(cookie >> 32)));
	}
	b = id ? bpf_map_lookup_elem(&vipd_backends, &id) : NULL;
	if (!b || !b->used) { /* none, or a free slot */
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	if (proto == IPPROTO_TCP && ctx->sk) {
		/* A TCP socket connects once: its record is socket local storage,
		 * freed with the socket (vipd_sock_conn in maps.h). */
		struct sock_conn *c = bpf_sk_storage_get(&vipd_sock_conn, ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);

		if (!c) {
			bpf_set_retval(-ECONNREFUSED);
			return 0; /* fail closed: an untracked translation could not be undone */
		}
		c->backend = b->addr;
		c->backend_port = b->port;
		c->vip = sk.addr;
		c->vip_port = sk.port;
		c->rev_nat_id = svc->rev_nat_id;
		c->backend_id = id;
	} else {
		k.cookie = cookie;
		k.addr = b->addr;
		k.port = b->port;
		v.vip = sk.addr;
		v.port = sk.port;
		v.rev_nat_id = svc->rev_nat_id;
		v.backend_id = id;
		if (bpf_map_update_elem(&vipd_sock_revnat, &k, &v, BPF_ANY) < 0) {
			bpf_set_retval(-ECONNREFUSED);
			return 0; /* fail closed: an untracked translation could not be undone */
		}
	}
	if (sock_addr_set(ctx, v6, &b->addr) < 0) {
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	ctx->user_port = b->port;
	return 1;
}

/* sock_reverse shows the VIP instead of the backend a socket talks to. */
static __always_inline int sock_reverse(struct bpf_sock_addr *ctx, int v6)
{
	struct sock_key k = {};
	struct sock_val *v;

	sock_addr_get(ctx, v6, &k.addr);
	k.port = (__be16)ctx->user_port;
	if (ctx->type == 1 /* SOCK_STREAM */) {
		struct sock_conn *c = ctx->sk ? bpf_sk_storage_get(&vipd_sock_conn, ctx->sk, 0, 0) : NULL;

		/* Only while it still talks to the backend it was given. */
		if (!c || c->backend_port != k.port || !addr_eq(&c->backend, &k.addr))
			return 1;
		if (sock_addr_set(ctx, v6, &c->vip) < 0)
			return 1;
		ctx->user_port = c->vip_port;
		return 1;
	}
	k.cookie = bpf_get_socket_cookie(ctx);
	v = bpf_map_lookup_elem(&vipd_sock_revnat, &k);
	if (!v)
		return 1;
	if (sock_addr_set(ctx, v6, &v->vip) < 0)
		return 1;
	ctx->user_port = v->port;
	return 1;
}

SEC("cgroup/connect4")
int vipd_sock_connect4(struct bpf_sock_addr *ctx) { return sock_translate(ctx, 0, 0); }

SEC("cgroup/connect6")
int vipd_sock_connect6(struct bpf_sock_addr *ctx) { return sock_translate(ctx, 1, 0); }

SEC("cgroup/sendmsg4")
int vipd_sock_sendmsg4(struct bpf_sock_addr *ctx) { return sock_translate(ctx, 0, 1); }

SEC("cgroup/sendmsg6")
int vipd_sock_sendmsg6(struct bpf_sock_addr *ctx) { return sock_translate(ctx, 1, 1); }

SEC("cgroup/recvmsg4")
int vipd_sock_recvmsg4(struct bpf_sock_addr *ctx) { return sock_reverse(ctx, 0); }

SEC("cgroup/recvmsg6")
int vipd_sock_recvmsg6(struct bpf_sock_addr *ctx) { return sock_reverse(ctx, 1); }

SEC("cgroup/getpeername4")
int vipd_sock_getpeername4(struct bpf_sock_addr *ctx) { return sock_reverse(ctx, 0); }

SEC("cgroup/getpeername6")
int vipd_sock_getpeername6(struct bpf_sock_addr *ctx) { return sock_reverse(ctx, 1); }
