/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * vipd's eBPF map layout. The Go side (dataplane/ebpf) mirrors every struct
 * here through bpf2go; change LAYOUT_VERSION whenever a key, value or map
 * type changes, so that a restarted vipd notices pinned maps of another
 * layout instead of misreading them.
 *
 * Addresses are 16 bytes; IPv4 is stored IPv4-mapped (::ffff:a.b.c.d), so
 * one code path and one set of maps serve both families.
 */
#ifndef VIPD_MAPS_H
#define VIPD_MAPS_H

#define LAYOUT_VERSION 7

union addr {
	__u32 w[4];
	__u8 b[16];
};

/* Frontend (service) flags, in svc_val.flags of a master entry. */
#define SVC_F_AFFINITY 1 /* ClientIP session affinity */
#define SVC_F_MAGLEV 2   /* pick by Maglev table, not at random */
#define SVC_F_WEIGHTED 4 /* slots carry cumulative weights */
#define SVC_F_DRAINING 8 /* deleted: tracked flows finish, nothing new is translated */
#define SVC_F_SNAT 16       /* external scope, policy Cluster: masquerade to the node's address */
#define SVC_F_DROP_EMPTY 32 /* external scope, policy Local: no backend drops instead of rejecting */
#define SVC_F_SRC_RANGES 64 /* load-balancer IP with source ranges (vipd_src_ranges) */
#define SVC_F_NODE_ALLOWED 128 /* with SVC_F_SRC_RANGES: a range holds a node address (for unbound node sockets) */

/*
 * svc_key.scope: which traffic a frontend serves. Cluster frontends serve
 * VIPs, and node ports, external and load-balancer IPs for pods and the
 * node's own processes (cluster semantics); external ones serve node ports,
 * external and load-balancer IPs for packets entering on an external
 * interface (vipd_from_ext), under the external traffic policy.
 */
#define SCOPE_CLUSTER 0
#define SCOPE_EXTERNAL 1

/*
 * One frontend is (VIP, port, protocol). Slot 0 is its master entry; slots
 * 1..count name the backends that may take new connections. A dense
 * frontend (svc_dense: unweighted, count <= SVC_INLINE_SLOTS) keeps its
 * slots in its master's value (svc_val.slots) and has no slot entries:
 * one entry per frontend instead of one per backend, written in one
 * update. The others have slot entries 1..count (and slots[] all zero).
 */
#define SVC_INLINE_SLOTS 16
struct svc_key {
	union addr addr;
	__be16 port;
	__u8 proto;
	__u8 scope; /* SCOPE_* */
	__u32 slot;
};

struct svc_val {
	__u32 backend_id;       /* slot: the backend */
	__u32 count;            /* master: number of slots; 0 rejects */
	__u32 rev_nat_id;       /* master: the frontend's ID */
	__u32 flags;            /* master: SVC_F_* */
	__u32 affinity_timeout; /* master: seconds */
	__u32 weight;           /* master: total weight; slot: cumulative weight, exclusive end */
	__u32 maglev_size;      /* master: Maglev table size M */
	__u32 pad;
	__u32 slots[SVC_INLINE_SLOTS]; /* dense master: backend IDs of slots 1..count */
};

/*
 * vipd_backends is an array indexed by backend ID (ID 0 is "none"), which
 * vipd writes and reads through its mmap. A slot whose used is 0 (all
 * zero) is free. IDs are recycled: vipd hands out never-used IDs first,
 * then freed ones oldest-freed first, and zeroes a slot when its backend
 * goes. So an ID held by a conntrack, affinity or socket entry may name
 * another backend by now; a tracked flow keeps its backend only while
 * the slot at its backend_id still holds its nat_addr:nat_port
 * (backend_is in vipd.c).
 */
#define BACKEND_USED 1
struct backend {
	union addr addr;
	__be16 port;
	__u8 used; /* BACKEND_USED: a backend holds this ID; 0: a free slot */
	__u8 pad;
	__u32 pad2;
};

/*
 * A backend is a member of a frontend while the service lists it. A
 * frontend with at most REVNAT_INLINE_MEMBERS members keeps them in its
 * reverse-NAT value (rev_nat.members, member_ids and member_flags): one
 * entry per frontend, and a membership or flags change is one update of
 * it. A larger one has rev_nat.members == REVNAT_MEMBERS_MAP and one
 * vipd_members entry per member (member_key -> MEMBER_F_* flags).
 */
struct member_key {
	__u32 rev_nat_id;
	__u32 backend_id;
};

#define MEMBER_F_ELIGIBLE 1 /* may take new connections */

#define REVNAT_INLINE_MEMBERS 16
#define REVNAT_MEMBERS_MAP 0xffffffff /* rev_nat.members: in vipd_members */

struct rev_nat {
	union addr addr;
	__be16 port;
	__u8 proto;
	__u8 scope;   /* the frontend's svc_key.scope */
	__u32 members; /* inline members (0..REVNAT_INLINE_MEMBERS), or REVNAT_MEMBERS_MAP */
	__u32 member_ids[REVNAT_INLINE_MEMBERS];  /* backend IDs of inline members 0..members-1 */
	__u8 member_flags[REVNAT_INLINE_MEMBERS]; /* their MEMBER_F_* flags */
};

#define CT_DIR_FORWARD 0 /* client -> VIP, as the client sent it */
#define CT_DIR_REPLY 1   /* backend -> client, as the backend sent it */

struct ct_key {
	union addr src;
	union addr dst;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;
	__u16 pad;
};

#define CT_F_HAIRPIN 1 /* client is its own backend: source NATed to the VIP */
#define CT_F_CLOSING 2 /* TCP FIN or RST seen */
#define CT_F_SEEN_REPLY 4
#define CT_F_SNAT 8 /* external, policy Cluster: source NATed to a node address (snat_addr) */

/* ct_entry.ev_flags, set atomically (each event is sent once). */
#define CT_EV_CLOSED 1 /* forward: the flow's CLOSED event was sent (or lost) */

struct ct_entry {
	union addr nat_addr; /* forward: backend; reply: VIP */
	__be16 nat_port;     /* forward: backend port; reply: VIP port */
	__u8 flags;          /* CT_F_* */
	__u8 tcp_flags;      /* TCP flags seen in this direction */
	__u32 backend_id;
	__u32 rev_nat_id;
	__u32 expires;       /* monotonic seconds */
	__u32 created;       /* monotonic seconds */
	__u32 ifindex;       /* where the flow entered */
	__u64 packets;       /* forward: client -> backend; reply: backend -> client */
	__u64 bytes;
	__u64 flow_id;       /* the same in both entries and in the flow's events */
	__u64 start_ns;      /* bpf_ktime_get_ns() of the first packet */
	__u32 ev_flags;      /* CT_EV_* */
	/* CT_F_SNAT: forward: the node address and port the client's source
	 * became; reply: the client's address and port. The reply entry's key
	 * (backend -> node address:port) is the NAT table's entry: its port is
	 * unique per backend and node address because it is inserted with
	 * BPF_NOEXIST. */
	__be16 snat_port;
	__u16 pad;
	union addr snat_addr;
};

/*
 * Flow events, in the vipd_events ring buffer. A flow's NEW event is sent
 * when its conntrack entries are created, its CLOSED event once: on the
 * first TCP FIN or RST in either direction, or when a packet finds the
 * flow expired or its backend gone and replaces it. vipd's conntrack
 * collector reports the flows that simply expire. An event that does not
 * fit the ring is counted in vipd_event_drops, never waited for.
 */
#define FLOW_EV_NEW 1
#define FLOW_EV_CLOSED 2

#define FLOW_CLOSE_FIN 1
#define FLOW_CLOSE_RST 2
#define FLOW_CLOSE_TIMEOUT 3
#define FLOW_CLOSE_BACKEND_REMOVED 4
#define FLOW_CLOSE_REPLACED 5 /* a TCP SYN reused the 5-tuple of a flow never seen to close */

struct flow_event {
	__u64 time_ns;  /* bpf_ktime_get_ns() */
	__u64 flow_id;
	__u64 start_ns;
	__u64 orig_packets; /* CLOSED: client -> backend */
	__u64 orig_bytes;
	__u64 reply_packets; /* CLOSED: backend -> client */
	__u64 reply_bytes;
	union addr client;
	union addr vip;
	union addr backend;
	__be16 client_port;
	__be16 vip_port;
	__be16 backend_port;
	__u8 proto;
	__u8 type;   /* FLOW_EV_* */
	__u8 reason; /* CLOSED: FLOW_CLOSE_* */
	__u8 pad[3];
	__u32 backend_id;
};

struct affinity_key {
	__u32 rev_nat_id;
	__u32 pad;
	union addr client; /* client address, or netns cookie for sockets */
};

struct affinity_val {
	__u32 backend_id;
	__u32 last_used; /* monotonic seconds */
};

/* Socket LB: what a socket's translated peer stands for. */
struct sock_key {
	__u64 cookie;
	union addr addr; /* backend */
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct sock_val {
	union addr vip;
	__be16 port;
	__u16 pad;
	__u32 rev_nat_id;
	__u32 backend_id;
	__u32 pad2;
};

/* Conntrack lifetimes in seconds (those of kube-proxy's nf_conntrack), the
 * defaults of struct config's. */
#define CT_TCP_SYN 60
#define CT_TCP_ESTABLISHED 86400
#define CT_TCP_CLOSE 10
#define CT_OTHER 60

/* Unconnected node-local UDP sockets: the backend each one's datagrams to
 * a VIP go to, so that a socket's exchange stays on one backend. */
struct sock_udp_key {
	__u64 cookie;
	union addr vip;
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct sock_udp_val {
	__u32 backend_id;
	__u32 last_used; /* monotonic seconds */
};

struct config {
	__u64 host_netns_cookie; /* socket hooks act only in this netns */
	__u32 layout_version;    /* at offset 8 in every layout */
	__u32 flags;
	/* Conntrack lifetimes in seconds after a flow's last packet; 0 takes
	 * the CT_* default. */
	__u32 ct_tcp_syn;         /* TCP, not answered yet */
	__u32 ct_tcp_established; /* TCP, answered */
	__u32 ct_tcp_close;       /* TCP, FIN or RST seen */
	__u32 ct_other;           /* UDP, SCTP */
	/* The source ports SNAT hands out (host order, inclusive); 0 takes
	 * the SNAT_PORT_* default. */
	__u16 snat_port_min;
	__u16 snat_port_max;
	/* Ports inside snat_port_min-max that SNAT never hands out (the
	 * namespace's ip_local_port_range, host order, inclusive); 0: none.
	 * In what was padding: the entry keeps its size. */
	__u16 snat_skip_min;
	__u16 snat_skip_max;
};

/*
 * SNAT ports when the config has none (vipd always writes them: see
 * ebpf.DefaultSNATPorts): outside Linux's default ip_local_port_range (32768-60999),
 * so the node's own connections do not pick them; a port a local socket
 * uses for the same peer is skipped all the same (bpf_sk_lookup).
 */
#define SNAT_PORT_MIN 61000
#define SNAT_PORT_MAX 65535
/* How many ports a new SNAT flow tries before it is dropped. */
#define SNAT_TRIES 32

/*
 * The backends' TIME_WAIT behind SNAT. When a backend closes an SNAT TCP
 * flow first, it keeps the TIME_WAIT of the backend-side tuple (node
 * address:port -> backend) for 60 s, and takes a new SYN on that tuple only
 * when Linux's tcp_timewait_state_process would: not PAWS-rejected, and
 * with a sequence number after the old flow's last one or a newer
 * timestamp. A new client's timestamps have their own offset (they depend
 * on its ports), so about half of them are older: refused, the client
 * resets and retries a second later. vipd_snat_tw remembers, per
 * backend-side tuple (the key of the flow's reply entry: backend ->
 * node address:port), how the client side of such a flow ended, and
 * ct_create does not hand the tuple's port to a SYN the TIME_WAIT would
 * refuse during SNAT_TW_GUARD. It is an LRU map of its own, not longer
 * lives of closed conntrack entries: its records must outlive the
 * conntrack entries (60 s against CT_TCP_CLOSE's 10 s) and are small
 * (120 bytes each with the kernel's overhead, against 200), and they never
 * push out the entries of live flows. At 5,000 closed flows a second it
 * would need 325,000: beyond its size the least recently used records
 * (mostly the oldest, nearest the end of their TIME_WAIT) go, and their
 * tuples lose the guard, as before it.
 */
#define SNAT_TW_F_TS 1 /* the client used timestamps: tsval is valid */

struct snat_tw {
	__u32 tsval;    /* the TSval of the client's last segment (SNAT_TW_F_TS) */
	__u32 next_seq; /* the sequence number after the client's last segment (its FIN counted) */
	__u32 closed;   /* monotonic seconds: when the client's FIN went through */
	__u32 flags;    /* SNAT_TW_F_* */
};

/* How long a record guards its tuple: Linux's TIME_WAIT (TCP_TIMEWAIT_LEN,
 * 60 s, not configurable) from the backend's last ACK, plus a margin for
 * the FIN's way and clocks read in whole seconds. */
#define SNAT_TW_GUARD 65

/* vipd_snat_stats slots. */
#define SNAT_STAT_EXHAUSTED 0 /* new SNAT flows dropped: no port in SNAT_TRIES tries */
#define SNAT_STAT_TW_SKIPS 1  /* ports skipped because the backend's TIME_WAIT would refuse the SYN */

/* load_balancer_source_ranges: the sources allowed to a frontend. */
struct src_range_key {
	__u32 prefixlen; /* 32 (rev_nat_id) + 128 bits of address at most */
	__u32 rev_nat_id;
	union addr addr;
};

/* An external interface: the node addresses SNAT uses on it. */
struct ext_iface {
	union addr addr4; /* zero: none */
	union addr addr6;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2000000);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_services SEC(".maps");

/* struct backend by backend ID; its size is configuration (MapSizes.Backends
 * in dataplane/ebpf), and IDs are below it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1048576);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2000000);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct member_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct rev_nat);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_revnat SEC(".maps");

struct maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 16381);
	__uint(map_flags, BPF_F_INNER_MAP);
	__type(key, __u32);
	__type(value, __u32);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, 262144);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct maglev_inner);
} vipd_maglev SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 524288);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_ct SEC(".maps");

/*
 * vipd_ct_srcs is a filter of the sources of conntrack reply entries: bit
 * ct_src_bit(addr, port) is set (before the entry is inserted) for the
 * backend address and port of every reply entry, and never cleared. A
 * packet whose source's bit is clear can match no reply entry, so the
 * packet path skips that lookup: the conntrack table is too large for the
 * CPU's caches, this filter (64 KiB) is not. A set bit only means "look".
 * It must be pinned with vipd_ct: a conntrack table kept without its filter
 * would lose its flows' replies (see loadObjects in dataplane/ebpf).
 */
#define CT_SRCS_BITS (1 << 19)
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CT_SRCS_BITS / 64);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_ct_srcs SEC(".maps");

/*
 * vipd_svc_addrs is a filter of frontends: bit svc_addr_bit(addr, port,
 * proto) is set by vipd (dataplane/ebpf, markFrontends) before it writes a
 * frontend's vipd_services entries, for every scope, and never cleared. A
 * packet whose destination's bit is clear goes to no frontend, so the packet
 * path skips the vipd_services lookup: a miss in that table (a reply to a
 * client's ephemeral port, say) is a cold bucket per connection, this
 * filter (64 KiB) stays in the caches. A set bit only means "look". It is
 * written by vipd only, never by the programs.
 */
#define SVC_ADDRS_BITS (1 << 19)
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_ADDRS_BITS / 64);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_svc_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct affinity_key);
	__type(value, struct affinity_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct sock_key);
	__type(value, struct sock_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_sock_revnat SEC(".maps");

/*
 * vipd_sock_conn is socket local storage: for a TCP socket whose connect()
 * the socket hooks translated, the backend it went to and the VIP that
 * backend stands for (getpeername shows the VIP). The record lives and dies
 * with the socket, so it needs no LRU and no insert into a shared table.
 * UDP sockets keep vipd_sock_revnat: an unconnected one talks to several
 * VIPs, and vipd finds connected ones stuck on removed backends there.
 */
struct sock_conn {
	union addr backend;
	union addr vip;
	__be16 backend_port;
	__be16 vip_port;
	__u32 rev_nat_id;
	__u32 backend_id;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_sock_conn SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct sock_udp_key);
	__type(value, struct sock_udp_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_sock_udp SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct src_range_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_src_ranges SEC(".maps");

/* The external interfaces, by ifindex. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct ext_iface);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_ext_ifaces SEC(".maps");

/* The lowest backend ID vipd never handed out (0), and the next reverse-NAT
 * ID (1). Reverse-NAT IDs only grow, across restarts too: a conntrack or
 * affinity entry that names a freed one must never find another frontend
 * under it. Backend IDs are recycled (see struct backend); slot 0 keeps
 * never-used IDs first across restarts. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_config SEC(".maps");

/* Flow events (struct flow_event). Its size is configuration (MapSizes.Events
 * in dataplane/ebpf); this is the default. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
	__type(value, struct flow_event); /* documentation (and BTF for bpf2go): a ring has no value size */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_events SEC(".maps");

/* The backends' TIME_WAIT behind SNAT (struct snat_tw), by reply key. Its
 * size is configuration (half of MapSizes.Conntrack in dataplane/ebpf);
 * this is the default. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct ct_key);
	__type(value, struct snat_tw);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_snat_tw SEC(".maps");

/* SNAT counters (SNAT_STAT_*), per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_snat_stats SEC(".maps");

/* Flow events that did not fit vipd_events, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vipd_event_drops SEC(".maps");

#endif
