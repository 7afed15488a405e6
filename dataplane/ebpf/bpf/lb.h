/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Backend selection, shared by the packet path (tc) and the socket path
 * (cgroup sock_addr hooks).
 */
#ifndef VIPD_LB_H
#define VIPD_LB_H

#define NSEC_PER_SEC 1000000000ULL

static __always_inline __u32 now_sec(void)
{
	return (__u32)(bpf_ktime_get_ns() / NSEC_PER_SEC);
}

static __always_inline __u32 mix32(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 hash_addr(__u32 h, const union addr *a)
{
	h = mix32(h ^ a->w[0]);
	h = mix32(h ^ a->w[1]);
	h = mix32(h ^ a->w[2]);
	h = mix32(h ^ a->w[3]);
	return h;
}

static __always_inline int addr_eq(const union addr *a, const union addr *b)
{
	return a->w[0] == b->w[0] && a->w[1] == b->w[1] && a->w[2] == b->w[2] && a->w[3] == b->w[3];
}

static __always_inline int addr_is4(const union addr *a)
{
	return a->w[0] == 0 && a->w[1] == 0 && a->w[2] == bpf_htonl(0xffff);
}

static __always_inline void addr_from4(union addr *a, __be32 ip)
{
	a->w[0] = 0;
	a->w[1] = 0;
	a->w[2] = bpf_htonl(0xffff);
	a->w[3] = ip;
}

/*
 * member_flags returns the MEMBER_F_* flags of backend_id in frontend
 * rev_nat_id, or -1 when it is no member. One lookup (vipd_revnat) for a
 * frontend whose members are inline, two for a larger one (vipd_members
 * too): see struct rev_nat.
 */
static __always_inline int member_flags(__u32 rev_nat_id, __u32 backend_id)
{
	struct member_key mk = {.rev_nat_id = rev_nat_id, .backend_id = backend_id};
	struct rev_nat *rn = bpf_map_lookup_elem(&vipd_revnat, &rev_nat_id);
	__u32 *f, n, i;

	if (!rn)
		return -1;
	n = rn->members;
	if (n != REVNAT_MEMBERS_MAP) {
		for (i = 0; i < REVNAT_INLINE_MEMBERS && i < n; i++) {
			if (rn->member_ids[i] == backend_id)
				return rn->member_flags[i];
		}
		return -1;
	}
	f = bpf_map_lookup_elem(&vipd_members, &mk);
	return f ? (int)*f : -1;
}

/* svc_dense reports whether a master keeps its slots in its value. */
static __always_inline int svc_dense(const struct svc_val *svc)
{
	return !(svc->flags & SVC_F_WEIGHTED) && svc->count <= SVC_INLINE_SLOTS;
}

/*
 * slot_backend returns the backend ID in slot (1..count) of a frontend, or 0
 * when the slot is missing (never for a consistent service, see the update
 * order in dataplane/ebpf): a dense frontend's from its master value svc,
 * another's from its slot entry.
 */
static __always_inline __u32 slot_backend(const struct svc_key *master, const struct svc_val *svc, __u32 slot,
					  __u32 *cum)
{
	struct svc_key k = *master;
	struct svc_val *v;

	if (svc_dense(svc)) {
		__u32 i = slot - 1;

		if (i >= SVC_INLINE_SLOTS)
			return 0;
		return svc->slots[i];
	}
	k.slot = slot;
	v = bpf_map_lookup_elem(&vipd_services, &k);
	if (!v)
		return 0;
	if (cum)
		*cum = v->weight;
	return v->backend_id;
}

/* pick_weighted finds the first slot whose cumulative weight exceeds r. */
static __always_inline __u32 pick_weighted(const struct svc_key *master, const struct svc_val *svc, __u32 r)
{
	__u32 lo = 1, hi = svc->count, cum = 0;
	int i;

	/* 17 halvings cover any 16-bit slot count. */
	for (i = 0; i < 17 && lo < hi; i++) {
		__u32 mid = lo + (hi - lo) / 2;

		if (!slot_backend(master, svc, mid, &cum))
			return 0;
		if (cum > r)
			hi = mid;
		else
			lo = mid + 1;
	}
	return slot_backend(master, svc, lo, NULL);
}

static __always_inline __u32 pick_maglev(const struct svc_val *svc, __u32 hash)
{
	__u32 id = svc->rev_nat_id, idx;
	__u32 *backend;
	void *table;

	if (!svc->maglev_size)
		return 0;
	table = bpf_map_lookup_elem(&vipd_maglev, &id);
	if (!table)
		return 0;
	idx = hash % svc->maglev_size;
	backend = bpf_map_lookup_elem(table, &idx);
	return backend ? *backend : 0;
}

/*
 * select_backend picks a backend for a new flow of a frontend with
 * count > 0. client identifies the client for session affinity; hash is a
 * per-flow hash for Maglev. It returns 0 when nothing can be picked.
 */
static __always_inline __u32 select_backend(const struct svc_key *master, const struct svc_val *svc,
					    const union addr *client, __u32 hash)
{
	struct affinity_key ak = {};
	struct affinity_val av = {}, *cur;
	__u32 now = 0, id = 0;

	/* The clock only for affinity: a read costs about 30 ns (FASTPATH.md 12). */
	if (svc->flags & SVC_F_AFFINITY) {
		now = now_sec();
		ak.rev_nat_id = svc->rev_nat_id;
		ak.client = *client;
		cur = bpf_map_lookup_elem(&vipd_affinity, &ak);
		if (cur && now - cur->last_used <= svc->affinity_timeout) {
			int f = member_flags(svc->rev_nat_id, cur->backend_id);

			if (f >= 0 && (f & MEMBER_F_ELIGIBLE))
				id = cur->backend_id;
		}
	}
	if (!id && (svc->flags & SVC_F_MAGLEV))
		id = pick_maglev(svc, hash);
	/* A Maglev table being swapped for one of another size can miss for
	 * an instant: then pick at random rather than fail. */
	if (!id) {
		if (svc->flags & SVC_F_WEIGHTED)
			id = svc->weight ? pick_weighted(master, svc, bpf_get_prandom_u32() % svc->weight) : 0;
		else
			id = slot_backend(master, svc, bpf_get_prandom_u32() % svc->count + 1, NULL);
	}
	if (id && (svc->flags & SVC_F_AFFINITY)) {
		av.backend_id = id;
		av.last_used = now;
		bpf_map_update_elem(&vipd_affinity, &ak, &av, BPF_ANY);
	}
	return id;
}

#endif
