#!/usr/bin/env python3
"""Generator for kube-proxy-shaped iptables-restore payloads (vipd benchmark).

Layouts (how the nat table is shaped):
  kp    kube-proxy shape: VIPD-SERVICES has one dispatch rule per service
        (-d VIP/32 -p tcp --dport 80 -j VIPD-SVC-<id>); VIPD-SVC-<id> has 5
        statistic rules -> VIPD-SEP-<id>-<k>; each SEP chain has a hairpin
        mark rule (-s ep/32 -j VIPD-MARK-MASQ) and a DNAT rule.
        Chains: 6 per service. Rules: 1 + 5 + 10 = 16 per service.
  trie  like kp, but VIPD-SERVICES holds one rule per /27 of VIPs that jumps to
        VIPD-DSP-<bucket>, which holds the <=32 per-service dispatch rules.
        A one-service change rewrites one 32-rule bucket chain instead of the
        whole 10k-rule VIPD-SERVICES chain.
  flat  like trie, but no SEP chains: VIPD-SVC-<id> holds, per endpoint, the
        statistic-gated DNAT directly (hairpin masquerade is done once in
        VIPD-POSTROUTING via conntrack, not per endpoint).
        Chains: 1 per service (+1 per 32 services). Rules: ~6 per service.

Usage:
  gen.py full    N [--layout kp|trie|flat] [--comments] [--no-hooks]
                   [--cache-trick none|S|Z]
  gen.py chunks  N --layout trie|flat [--chunk K]   (bottom-up chunked load)
  gen.py decl    C [--order asc|desc|hash]        (C chain declarations only)
  gen.py spread  R --chains C                     (R plain rules over C chains)
  gen.py partial N --variant V [--layout ...] [--svc I] [--gen G]
  gen.py probe   FEATURE   (tiny payloads for feature checks)

Partial variants (against a table loaded with `full N` of the same layout):
  noop          *nat / COMMIT only
  svc           redeclare VIPD-SVC-<id> and its 5 SEP chains (same names),
                endpoint 0 gets a new address; VIPD-SERVICES untouched
  svc-newsep    kube-proxy-faithful: endpoint 0 gets a NEW SEP chain name, the
                SVC chain is rewritten to point at it, the old SEP chain is -X'd
  svc+bucket    svc plus redeclare+rewrite the 32-rule dispatch bucket chain
                (trie layout)
  svc+services  svc plus redeclare+rewrite the whole VIPD-SERVICES chain
                (kube-proxy-style partial restore; kp layout)
  svc-flush     like svc but uses -F CHAIN instead of :CHAIN declarations
  svc100        100 services rewritten in one restore (batched sync)
  svc-S         svc with the '-S' cache trick in front (shows its cost at 10k)
  append        a single '-A VIPD-SEP-<id>-0 ...' with no chain declarations
"""
import argparse
import hashlib
import sys

DPORT = 80
TPORT = 8080
EPS = 5
BUCKET = 32


def sid(i):
    """12-char upper hex id for service i (hash-like, as kube-proxy's)."""
    return hashlib.sha256(b"svc-%d" % i).hexdigest()[:12].upper()


def vip(i):
    return "198.19.%d.%d" % ((i >> 8) & 255, i & 255)


def ep(i, k, gen=0):
    """Endpoint address/port. 150k endpoints at 30k services exceed a /16,
    so wrap addresses and vary the target port per wrap."""
    idx = i * EPS + k + gen * 7919
    a = idx % 65534 + 1
    wrap = idx // 65534
    return "198.18.%d.%d" % (a >> 8, a & 255), TPORT + wrap


def prob(k):
    # kube-proxy style: 1/5, 1/4, 1/3, 1/2 for the first 4, last unconditional
    n = EPS - k
    return "%.11f" % (1.0 / n)


def svc_chain(i):
    return "VIPD-SVC-" + sid(i)


def sep_chain(i, k, tag=""):
    return "VIPD-SEP-%s-%s%d" % (sid(i), tag, k)


def bucket_chain(b):
    return "VIPD-DSP-%04X" % b


def comment(i, args):
    if getattr(args, "comments", False):
        return ' -m comment --comment "ns%d/svc%d:http"' % (i % 97, i)
    return ""


def dispatch_rule(chain, i, args):
    return "-A %s -d %s/32 -p tcp -m tcp --dport %d%s -j %s" % (
        chain, vip(i), DPORT, comment(i, args), svc_chain(i))


def svc_rules(i, args, gen=0, sep_tag=None):
    """Rules (no declarations) for service i's SVC chain (+SEPs if kp/trie)."""
    out = []
    svc = svc_chain(i)
    for k in range(EPS):
        stat = ""
        if k < EPS - 1:
            stat = " -m statistic --mode random --probability %s" % prob(k)
        g = gen if k == 0 else 0
        addr, port = ep(i, k, g)
        if args.layout == "flat":
            out.append("-A %s%s%s -p tcp -m tcp -j DNAT --to-destination %s:%d" % (
                svc, comment(i, args), stat, addr, port))
        else:
            tag = sep_tag if (sep_tag and k == 0) else ""
            out.append("-A %s%s%s -j %s" % (svc, comment(i, args), stat, sep_chain(i, k, tag)))
    if args.layout != "flat":
        for k in range(EPS):
            g = gen if k == 0 else 0
            addr, port = ep(i, k, g)
            tag = sep_tag if (sep_tag and k == 0) else ""
            sep = sep_chain(i, k, tag)
            out.append("-A %s%s -s %s/32 -j VIPD-MARK-MASQ" % (sep, comment(i, args), addr))
            out.append("-A %s%s -p tcp -m tcp -j DNAT --to-destination %s:%d" % (
                sep, comment(i, args), addr, port))
    return out


def svc_chains(i, args, sep_tag=None):
    ch = [svc_chain(i)]
    if args.layout != "flat":
        for k in range(EPS):
            tag = sep_tag if (sep_tag and k == 0) else ""
            ch.append(sep_chain(i, k, tag))
    return ch


def decl(c):
    return ":%s - [0:0]" % c


def full(args):
    n = args.n
    o = []
    w = o.append
    w("*nat")
    trick = getattr(args, "cache_trick", "none")
    if trick == "S":
        # iptables-nft <=1.8.9 workaround: a chain-less command makes the
        # restore fetch the whole chain list once instead of building a
        # sorted linked list of every chain named in the payload (O(C^2)).
        # -S only lists (output discarded). The builtin chain lines make sure
        # the nat base chains exist when the table did not exist before
        # (nat policies are always ACCEPT, so they change nothing).
        w("-S")
        for c in ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"):
            w(":%s ACCEPT [0:0]" % c)
    elif trick == "Z":
        w("-Z")  # same effect, but zeroes every counter in the table
    base = ["VIPD-SERVICES", "VIPD-MARK-MASQ", "VIPD-POSTROUTING"]
    for c in base:
        w(decl(c))
    nb = (n + BUCKET - 1) // BUCKET
    if args.layout in ("trie", "flat"):
        for b in range(nb):
            w(decl(bucket_chain(b)))
    for i in range(n):
        for c in svc_chains(i, args):
            w(decl(c))
    if not args.no_hooks:
        w("-A PREROUTING -j VIPD-SERVICES")
        w("-A OUTPUT -j VIPD-SERVICES")
        w("-A POSTROUTING -j VIPD-POSTROUTING")
    w("-A VIPD-MARK-MASQ -j MARK --or-mark 0x4000")
    if args.layout == "flat":
        # hairpin: DNAT'ed flows whose source is an endpoint get masqueraded
        w("-A VIPD-POSTROUTING -m conntrack --ctstate DNAT -s 198.18.0.0/16 -d 198.18.0.0/16 -j VIPD-MARK-MASQ")
    w("-A VIPD-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN")
    w("-A VIPD-POSTROUTING -j MARK --xor-mark 0x4000")
    w("-A VIPD-POSTROUTING -j MASQUERADE --random-fully")
    if args.layout == "kp":
        for i in range(n):
            w(dispatch_rule("VIPD-SERVICES", i, args))
    else:
        for b in range(nb):
            # bucket b covers services b*32 .. b*32+31 whose VIPs form a /27
            lo = b * BUCKET
            w("-A VIPD-SERVICES -d %s/27 -j %s" % (vip(lo), bucket_chain(b)))
        for i in range(n):
            w(dispatch_rule(bucket_chain(i // BUCKET), i, args))
    for i in range(n):
        o.extend(svc_rules(i, args))
    w("COMMIT")
    o.extend(full_filter(args))
    return o


def partial(args):
    n = args.n
    i = args.svc if args.svc is not None else n // 2
    g = args.gen
    v = args.variant
    o = ["*nat"]
    w = o.append
    if v == "noop":
        pass
    elif v in ("svc", "svc+bucket", "svc+services"):
        for c in svc_chains(i, args):
            w(decl(c))
        if v == "svc+bucket":
            w(decl(bucket_chain(i // BUCKET)))
        if v == "svc+services":
            w(decl("VIPD-SERVICES"))
        o.extend(svc_rules(i, args, gen=g))
        if v == "svc+bucket":
            b = i // BUCKET
            for j in range(b * BUCKET, min(n, (b + 1) * BUCKET)):
                w(dispatch_rule(bucket_chain(b), j, args))
        if v == "svc+services":
            if args.layout == "kp":
                for j in range(n):
                    w(dispatch_rule("VIPD-SERVICES", j, args))
            else:
                nb = (n + BUCKET - 1) // BUCKET
                for b in range(nb):
                    w("-A VIPD-SERVICES -d %s/27 -j %s" % (vip(b * BUCKET), bucket_chain(b)))
    elif v == "svc100":
        # one batched sync that rewrites 100 services (endpoint churn)
        for j in range(100):
            sj = (i + j * 97) % n
            for c in svc_chains(sj, args):
                w(decl(c))
            o.extend(svc_rules(sj, args, gen=g))
    elif v == "svc-S":
        # the cache trick used on a partial: costs a full rule dump
        w("-S")
        for c in svc_chains(i, args):
            w(decl(c))
        o.extend(svc_rules(i, args, gen=g))
    elif v == "svc-flush":
        for c in svc_chains(i, args):
            w("-F " + c)
        o.extend(svc_rules(i, args, gen=g))
    elif v == "svc-newsep":
        # gen g: SEP 0 of service i is called ...-G<g>0 (new), old is ...-G<g-1>0
        # (gen 0 == the name written by `full`).
        new = "G%d" % g
        old = "G%d" % (g - 1) if g > 1 else ""
        for c in svc_chains(i, args, sep_tag=new):
            w(decl(c))
        # the stale chain must be flushed (declared) before it can be -X'd,
        # exactly like kube-proxy does
        w(decl(sep_chain(i, 0, old)))
        o.extend(svc_rules(i, args, gen=g, sep_tag=new))
        w("-X " + sep_chain(i, 0, old))
    elif v == "append":
        addr, port = ep(i, 0, g)
        w("-A %s -s %s/32 -m comment --comment gen%d -j RETURN" % (svc_chain(i), addr, g))
    else:
        raise SystemExit("unknown variant " + v)
    w("COMMIT")
    return o


def chunks(args):
    """Bottom-up chunked initial load for the trie layout: returns a list of
    payloads. Chunk 0..k-1 each create services [j*K, (j+1)*K) with their
    bucket chains (unreachable until the last chunk), the last chunk creates
    VIPD-SERVICES (N/32 rules), the hooks and the filter table part."""
    assert args.layout in ("trie", "flat")
    n, K = args.n, args.chunk
    assert K % BUCKET == 0
    out = []
    for lo in range(0, n, K):
        hi = min(n, lo + K)
        o = ["*nat"]
        w = o.append
        if lo == 0:
            w(decl("VIPD-MARK-MASQ"))
            w("-A VIPD-MARK-MASQ -j MARK --or-mark 0x4000")
        for b in range(lo // BUCKET, (hi + BUCKET - 1) // BUCKET):
            w(decl(bucket_chain(b)))
        for i in range(lo, hi):
            for c in svc_chains(i, args):
                w(decl(c))
        for i in range(lo, hi):
            w(dispatch_rule(bucket_chain(i // BUCKET), i, args))
        for i in range(lo, hi):
            o.extend(svc_rules(i, args))
        w("COMMIT")
        out.append(o)
    o = ["*nat"]
    w = o.append
    w(decl("VIPD-SERVICES"))
    w(decl("VIPD-POSTROUTING"))
    nb = (n + BUCKET - 1) // BUCKET
    for b in range(nb):
        w("-A VIPD-SERVICES -d %s/27 -j %s" % (vip(b * BUCKET), bucket_chain(b)))
    if args.layout == "flat":
        w("-A VIPD-POSTROUTING -m conntrack --ctstate DNAT -s 198.18.0.0/16 -d 198.18.0.0/16 -j VIPD-MARK-MASQ")
    w("-A VIPD-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN")
    w("-A VIPD-POSTROUTING -j MARK --xor-mark 0x4000")
    w("-A VIPD-POSTROUTING -j MASQUERADE --random-fully")
    if not args.no_hooks:
        w("-A PREROUTING -j VIPD-SERVICES")
        w("-A OUTPUT -j VIPD-SERVICES")
        w("-A POSTROUTING -j VIPD-POSTROUTING")
    w("COMMIT")
    o.extend(full_filter(args))
    out.append(o)
    return out


def full_filter(args):
    o = ["*filter", decl("VIPD-REJECT")]
    if not args.no_hooks:
        o += ["-A INPUT -j VIPD-REJECT", "-A FORWARD -j VIPD-REJECT", "-A OUTPUT -j VIPD-REJECT"]
    for j in range(4):
        o.append("-A VIPD-REJECT -d 198.19.255.%d/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable" % (j + 1))
    o.append("COMMIT")
    return o


def decl_only(args):
    """C chain declarations only (no rules), ascending or descending."""
    names = sorted("VIPD-SEP-%s-%d" % (sid(i // EPS), i % EPS) for i in range(args.n))
    if args.order == "desc":
        names.reverse()
    elif args.order == "hash":
        names = ["VIPD-SEP-%s-%d" % (sid(i // EPS), i % EPS) for i in range(args.n)]
    return ["*nat"] + [decl(c) for c in names] + ["COMMIT"]


def rules_spread(args):
    """R rules (no jumps) spread over C chains (R/C rules each)."""
    r, c = args.n, args.chains
    names = ["VIPD-R-%06d" % j for j in range(c)]
    o = ["*nat"] + [decl(x) for x in names]
    for k in range(r):
        j = k % c
        o.append("-A %s -d 198.19.%d.%d/32 -p tcp -m tcp --dport 80 -j RETURN" % (names[j], (k >> 8) & 255, k & 255))
    o.append("COMMIT")
    return o


PROBES = {
    # name: (table, rules) ; chain VIPD-PROBE is created in that table
    "xt_statistic": ("nat", ["-A VIPD-PROBE -m statistic --mode random --probability 0.25000000000 -j RETURN",
                             "-A VIPD-PROBE -m statistic --mode nth --every 3 --packet 0 -j RETURN"]),
    "xt_comment": ("nat", ['-A VIPD-PROBE -m comment --comment "ns/svc:http" -j RETURN']),
    "xt_recent": ("filter", ["-A VIPD-PROBE -m recent --set --name vipdprobe --mask 255.255.255.255 --rsource",
                             "-A VIPD-PROBE -m recent --rcheck --seconds 10800 --reap --name vipdprobe --mask 255.255.255.255 --rsource -j RETURN"]),
    "xt_conntrack": ("filter", ["-A VIPD-PROBE -m conntrack --ctstate INVALID -j DROP",
                                "-A VIPD-PROBE -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                                "-A VIPD-PROBE -m conntrack --ctstate DNAT -j RETURN"]),
    "xt_sctp": ("nat", ["-A VIPD-PROBE -d 198.19.0.1/32 -p sctp -m sctp --dport 80 -j DNAT --to-destination 198.18.0.1:8080"]),
    "masquerade_random_fully": ("nat", ["-A VIPD-PROBE -j MASQUERADE --random-fully"]),
    "reject": ("filter", ["-A VIPD-PROBE -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable",
                          "-A VIPD-PROBE -p tcp -m tcp --dport 81 -j REJECT --reject-with tcp-reset"]),
    "dnat": ("nat", ["-A VIPD-PROBE -d 198.19.0.1/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 198.18.0.1:8080"]),
    "mark": ("nat", ["-A VIPD-PROBE -j MARK --or-mark 0x4000",
                     "-A VIPD-PROBE -m mark ! --mark 0x4000/0x4000 -j RETURN"]),
    "addrtype": ("nat", ["-A VIPD-PROBE -m addrtype --dst-type LOCAL -j RETURN"]),
}


def probe(args):
    table, rules = PROBES[args.feature]
    return ["*" + table, decl("VIPD-PROBE")] + rules + ["COMMIT"]


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("full")
    f.add_argument("n", type=int)
    p = sub.add_parser("partial")
    p.add_argument("n", type=int)
    p.add_argument("--variant", required=True)
    p.add_argument("--svc", type=int)
    p.add_argument("--gen", type=int, default=1)
    f.add_argument("--cache-trick", default="none", choices=["none", "S", "Z"])
    c = sub.add_parser("chunks")
    c.add_argument("n", type=int)
    c.add_argument("--chunk", type=int, default=512)
    d = sub.add_parser("decl")
    d.add_argument("n", type=int)
    d.add_argument("--order", default="asc", choices=["asc", "desc", "hash"])
    r = sub.add_parser("spread")
    r.add_argument("n", type=int)
    r.add_argument("--chains", type=int, default=1)
    for s in (f, p, c):
        s.add_argument("--layout", default="kp", choices=["kp", "trie", "flat"])
        s.add_argument("--comments", action="store_true")
        s.add_argument("--no-hooks", action="store_true")
    pr = sub.add_parser("probe")
    pr.add_argument("feature", choices=sorted(PROBES))
    args = ap.parse_args()
    if args.cmd == "chunks":
        for j, o in enumerate(chunks(args)):
            sys.stdout.write("# ---- chunk %d\n" % j + "\n".join(o) + "\n")
        return
    fn = {"full": full, "partial": partial, "probe": probe, "decl": decl_only,
          "spread": rules_spread}[args.cmd]
    sys.stdout.write("\n".join(fn(args)) + "\n")


if __name__ == "__main__":
    main()
