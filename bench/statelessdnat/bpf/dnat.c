/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The benchmark's stateless DNAT: the least a tc program can do to send a
 * VIP's TCP connections to backends, as the reference line of the data-path
 * table ("what eBPF can reach here"). No conntrack, no events, no maps.
 *
 *   dnat_from_client  tcx ingress of the client pod's host-side veth: a TCP
 *                     packet to vip:vport gets a backend's address and
 *                     port target_port, picked by a hash of the source
 *                     address and port (the same for every packet of a
 *                     connection).
 *   dnat_to_client    tcx egress of that veth: a TCP reply from
 *                     backend:target_port to a client port in
 *                     [rev_port_lo, rev_port_hi] gets vip:vport back as its
 *                     source. The port range is what tells a reply of a
 *                     VIP connection from a reply to a direct one without
 *                     state: the benchmark's VIP runs use their own range.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_BACKENDS 16

/* Set by the loader before the program is loaded; all in network order but
 * the count and the reverse port range. */
volatile const __be32 vip;
volatile const __be16 vport;
volatile const __be16 target_port;
volatile const __u32 backend_count;
volatile const __be32 backends[MAX_BACKENDS];
volatile const __u16 rev_port_lo;
volatile const __u16 rev_port_hi;

#define IP_CSUM_OFF (ETH_HLEN + offsetof(struct iphdr, check))
#define IP_DST_OFF (ETH_HLEN + offsetof(struct iphdr, daddr))
#define IP_SRC_OFF (ETH_HLEN + offsetof(struct iphdr, saddr))

/* tcp_off returns the offset of the TCP header of an unfragmented IPv4 TCP
 * packet with a plain 20-byte IP header, or 0. */
static __always_inline int tcp_off(struct __sk_buff *skb, struct iphdr **ip, struct tcphdr **tcp)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	*ip = (void *)(eth + 1);
	if ((void *)(*ip + 1) > end || (*ip)->protocol != IPPROTO_TCP || (*ip)->ihl != 5)
		return 0;
	*tcp = (void *)(*ip + 1);
	if ((void *)(*tcp + 1) > end)
		return 0;
	return ETH_HLEN + sizeof(struct iphdr);
}

/* rewrite replaces the IPv4 address at addr_off and the TCP port at
 * port_off, fixing both checksums. */
static __always_inline void rewrite(struct __sk_buff *skb, int l4, __u32 addr_off, __be32 from_a, __be32 to_a,
				    __u32 port_off, __be16 from_p, __be16 to_p)
{
	__u32 tcp_csum = l4 + offsetof(struct tcphdr, check);
	bpf_l4_csum_replace(skb, tcp_csum, from_a, to_a, BPF_F_PSEUDO_HDR | sizeof(to_a));
	bpf_l4_csum_replace(skb, tcp_csum, from_p, to_p, sizeof(to_p));
	bpf_l3_csum_replace(skb, IP_CSUM_OFF, from_a, to_a, sizeof(to_a));
	bpf_skb_store_bytes(skb, addr_off, &to_a, sizeof(to_a), 0);
	bpf_skb_store_bytes(skb, port_off, &to_p, sizeof(to_p), 0);
}

SEC("tcx/ingress")
int dnat_from_client(struct __sk_buff *skb)
{
	struct iphdr *ip;
	struct tcphdr *tcp;
	int l4 = tcp_off(skb, &ip, &tcp);
	if (!l4 || ip->daddr != vip || tcp->dest != vport || backend_count == 0)
		return TC_ACT_OK;
	__u32 h = ip->saddr ^ ((__u32)tcp->source * 0x9e3779b1u);
	h ^= h >> 16;
	__u32 i = h % backend_count;
	if (i >= MAX_BACKENDS)
		return TC_ACT_OK;
	__be32 to = backends[i];
	rewrite(skb, l4, IP_DST_OFF, vip, to, l4 + offsetof(struct tcphdr, dest), vport, target_port);
	return TC_ACT_OK;
}

SEC("tcx/egress")
int dnat_to_client(struct __sk_buff *skb)
{
	struct iphdr *ip;
	struct tcphdr *tcp;
	int l4 = tcp_off(skb, &ip, &tcp);
	if (!l4 || tcp->source != target_port)
		return TC_ACT_OK;
	__u16 cport = bpf_ntohs(tcp->dest);
	if (cport < rev_port_lo || cport > rev_port_hi)
		return TC_ACT_OK;
	__be32 from = ip->saddr;
	__u32 n = backend_count;
	int found = 0;
	for (__u32 i = 0; i < MAX_BACKENDS && i < n; i++)
		if (backends[i] == from)
			found = 1;
	if (!found)
		return TC_ACT_OK;
	rewrite(skb, l4, IP_SRC_OFF, from, vip, l4 + offsetof(struct tcphdr, source), target_port, vport);
	return TC_ACT_OK;
}

char __license[] SEC("license") = "Dual BSD/GPL";
