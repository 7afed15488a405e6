#!/usr/bin/env python3
"""vipd iptables-mode benchmark: iptables-nft vs iptables-legacy rule programming.

Everything runs inside network namespaces named vipdmeas-<pid>-<k> that this
process creates and always deletes (finally/atexit/signal handlers). It never
touches the root namespace's rules. No traffic is sent.

Usage: bench.py [--quick] [--only SECTION,...] [--out DIR]
Sections: env, features, full, partial, reads, diag
Env: STEP_TIMEOUT (s, default 300), REPS (default 5), REPS_BIG (default 3)
"""
import argparse
import atexit
import datetime
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen  # noqa: E402

STEP_TIMEOUT = float(os.environ.get("STEP_TIMEOUT", "300"))
REPS = int(os.environ.get("REPS", "5"))
REPS_BIG = int(os.environ.get("REPS_BIG", "3"))

MODES = ["nft", "legacy"]
BIN = {
    "nft": {"restore": ["iptables-nft-restore"], "save": ["iptables-nft-save"],
            "ipt": ["iptables-nft", "-w"]},
    # legacy-restore takes the global xtables lock (/run/xtables.lock, shared
    # with the root namespace): wait for it instead of failing.
    "legacy": {"restore": ["iptables-legacy-restore", "-w", "30"],
               "save": ["iptables-legacy-save"], "ipt": ["iptables-legacy", "-w", "30"]},
}


# --------------------------------------------------------------------------
# namespace + temp-dir bookkeeping (always cleaned up)

class State:
    namespaces = []
    tmpdir = None
    counter = 0
    child = None   # the Popen currently running, killed on interrupt


def log(*a):
    print("[%s]" % time.strftime("%H:%M:%S"), *a, flush=True)


def cleanup():
    c = State.child
    if c is not None and c.poll() is None:
        try:
            c.kill()
            c.wait(timeout=10)
        except Exception:
            pass
    State.child = None
    for ns in list(State.namespaces):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        State.namespaces.remove(ns)
    if State.tmpdir and os.path.isdir(State.tmpdir):
        shutil.rmtree(State.tmpdir, ignore_errors=True)
        State.tmpdir = None


def _sig(signum, frame):
    raise SystemExit(128 + signum)


def ns_new():
    State.counter += 1
    name = "vipdmeas-%d-%d" % (os.getpid(), State.counter)
    subprocess.run(["ip", "netns", "add", name], check=True)
    State.namespaces.append(name)
    return name


def ns_del(name):
    subprocess.run(["ip", "netns", "del", name], check=False)
    if name in State.namespaces:
        State.namespaces.remove(name)


def tmp(name):
    return os.path.join(State.tmpdir, name)


def write_payload(name, lines):
    p = tmp(name)
    with open(p, "w") as f:
        f.write("\n".join(lines) + "\n")
    return p


# --------------------------------------------------------------------------
# running one command with wall time + rusage + timeout

def run(argv, ns=None, stdin=None, timeout=STEP_TIMEOUT, keep_stdout=False):
    full = (["ip", "netns", "exec", ns] if ns else []) + list(argv)
    out_path = tmp("stdout.%d" % State.counter)
    err_path = tmp("stderr.%d" % State.counter)
    fin = open(stdin) if stdin else subprocess.DEVNULL
    fout = open(out_path, "w")
    ferr = open(err_path, "w")
    t0 = time.perf_counter()
    p = subprocess.Popen(full, stdin=fin, stdout=fout, stderr=ferr)
    State.child = p
    killed = {"v": False}

    def kill():
        killed["v"] = True
        try:
            p.kill()
        except ProcessLookupError:
            pass
    timer = threading.Timer(timeout, kill)
    timer.daemon = True
    timer.start()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    timer.cancel()
    State.child = None
    p.returncode = os.waitstatus_to_exitcode(status)
    for f in (fout, ferr):
        f.close()
    if stdin:
        fin.close()
    with open(err_path, errors="replace") as f:
        err = f.read()
    res = {"wall": wall, "user": ru.ru_utime, "sys": ru.ru_stime, "rc": p.returncode,
           "timeout": killed["v"], "stderr": err[-800:]}
    if keep_stdout:
        with open(out_path, errors="replace") as f:
            res["stdout"] = f.read()
    os.unlink(out_path)
    os.unlink(err_path)
    return res


def summarize(runs, ok_rc=(0,)):
    ok = [r for r in runs if r["rc"] in ok_rc and not r["timeout"]]
    s = {"n": len(runs), "ok": len(ok), "runs": [round(r["wall"], 4) for r in runs]}
    if ok:
        s["wall"] = statistics.median(r["wall"] for r in ok)
        s["user"] = statistics.median(r["user"] for r in ok)
        s["sys"] = statistics.median(r["sys"] for r in ok)
        s["min"] = min(r["wall"] for r in ok)
        s["max"] = max(r["wall"] for r in ok)
    bad = [r for r in runs if r["rc"] not in ok_rc or r["timeout"]]
    if bad:
        s["timeout"] = any(r["timeout"] for r in bad)
        s["error"] = bad[0]["stderr"][-400:] or ("timeout after %ss" % STEP_TIMEOUT)
    return s


def fmt(s):
    if not s:
        return "-"
    if "wall" in s:
        return "%.3fs (u%.2f s%.2f, %d/%d)" % (s["wall"], s["user"], s["sys"], s["ok"], s["n"])
    return "FAILED: " + s.get("error", "?")[:120]


def count_rules(mode, ns, table="nat"):
    r = run(BIN[mode]["save"] + ["-t", table], ns=ns, keep_stdout=True)
    return sum(1 for ln in r["stdout"].splitlines() if ln.startswith("-A ")), \
        sum(1 for ln in r["stdout"].splitlines() if ln.startswith(":"))


def A(**kw):
    d = dict(layout="kp", comments=False, no_hooks=False, cache_trick="none",
             svc=None, gen=1, variant=None, chunk=512)
    d.update(kw)
    return argparse.Namespace(**d)


def expected_nat_rules(n, layout, hooks=True):
    nb = (n + gen.BUCKET - 1) // gen.BUCKET
    per = {"kp": 16, "trie": 16, "flat": 6}[layout]
    extra = (nb if layout != "kp" else 0) + 4 + (1 if layout == "flat" else 0) + (3 if hooks else 0)
    return n * per + extra


# --------------------------------------------------------------------------
# sections

R = {}  # results


def sec_env():
    log("env")
    def sh(c):
        p = subprocess.run(c, shell=True, capture_output=True, text=True)
        return (p.stdout + p.stderr).strip()
    R["env"] = {
        "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M:%SZ"),
        "nproc": os.cpu_count(),
        "uname": platform.release(),
        "cpu": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
        "mem": sh("grep MemTotal /proc/meminfo"),
        "loadavg_start": sh("cat /proc/loadavg"),
        "debian": sh("cat /etc/debian_version"),
        "iptables": sh("iptables --version"),
        "iptables_legacy": sh("iptables-legacy --version"),
        "iptables_nft": sh("iptables-nft --version"),
        "nft": sh("nft --version 2>&1 || echo 'nft not installed'"),
        "alternatives": sh("readlink -f /usr/sbin/iptables"),
        "pkgs": sh("dpkg-query -W iptables libnftnl11 libxtables12 libip4tc2 nftables conntrack 2>&1"),
    }
    ns = ns_new()
    try:
        r = run(["iptables-legacy", "-w", "30", "-t", "nat", "-L", "-n"], ns=ns, keep_stdout=True)
        R["env"]["legacy_in_netns"] = {"rc": r["rc"], "out": (r["stdout"] + r["stderr"])[:400]}
        r2 = run(["cat", "/proc/net/ip_tables_names"], ns=ns, keep_stdout=True)
        R["env"]["legacy_tables_in_ns"] = r2["stdout"].strip()
    finally:
        ns_del(ns)
    for k, v in R["env"].items():
        log("  %s: %s" % (k, v))


def sec_features():
    log("features")
    R["features"] = {}
    for mode in MODES:
        for feat in sorted(gen.PROBES):
            table, rules = gen.PROBES[feat]
            p = write_payload("probe.txt", gen.probe(argparse.Namespace(feature=feat)))
            ns = ns_new()
            try:
                r = run(BIN[mode]["restore"] + ["--noflush"], ns=ns, stdin=p, timeout=60)
                s = run(BIN[mode]["save"] + ["-t", table], ns=ns, keep_stdout=True, timeout=60)
                saved = [ln for ln in s["stdout"].splitlines() if ln.startswith("-A VIPD-PROBE")]
                ok = r["rc"] == 0 and len(saved) == len(rules)
                R["features"]["%s/%s" % (mode, feat)] = {
                    "ok": ok, "rc": r["rc"], "err": r["stderr"].strip()[:300], "saved": saved}
                log("  %-6s %-24s %s %s" % (mode, feat, "OK " if ok else "FAIL", (r["stderr"].strip() or "")[:100]))
            finally:
                ns_del(ns)


def load_time(mode, payload, flush=False, timeout=STEP_TIMEOUT, verify=None):
    """Load payload into a fresh namespace, return run result (+verify count)."""
    ns = ns_new()
    try:
        args = BIN[mode]["restore"] + ([] if flush else ["--noflush"])
        r = run(args, ns=ns, stdin=payload, timeout=timeout)
        if verify is not None and r["rc"] == 0 and not r["timeout"]:
            got, _ = count_rules(mode, ns)
            r["verified"] = (got == verify)
            if got != verify:
                r["rc"] = 99
                r["stderr"] += "\nverify: expected %d nat rules, got %d" % (verify, got)
        return r
    finally:
        ns_del(ns)


def chunked_load_time(mode, files, timeout=STEP_TIMEOUT, verify=None):
    ns = ns_new()
    try:
        tot = {"wall": 0.0, "user": 0.0, "sys": 0.0, "rc": 0, "timeout": False, "stderr": ""}
        for fpath in files:
            r = run(BIN[mode]["restore"] + ["--noflush"], ns=ns, stdin=fpath, timeout=timeout)
            for k in ("wall", "user", "sys"):
                tot[k] += r[k]
            if r["rc"] != 0 or r["timeout"]:
                tot.update(rc=r["rc"], timeout=r["timeout"], stderr=r["stderr"])
                break
        if verify is not None and tot["rc"] == 0:
            got, _ = count_rules(mode, ns)
            if got != verify:
                tot["rc"] = 99
                tot["stderr"] += "verify: expected %d, got %d" % (verify, got)
        return tot
    finally:
        ns_del(ns)


def sec_full(quick):
    log("full initial load")
    R.setdefault("full", {})
    sizes = [1000, 2000, 4000, 10000, 30000] if not quick else [1000, 2000, 10000]

    def reps_for(n):
        return REPS if n <= 2000 else REPS_BIG

    def series(key, mode, mk_payload, layout, flush=False, sizes=sizes, growth_guard=True):
        prev = None
        for n in sizes:
            k = "%s|%s|%d" % (key, mode, n)
            # predicted quadratic blow-up or a previous slow step -> skip
            if prev and prev[1].get("wall") is None:
                R["full"][k] = {"skipped": "previous size failed/timed out"}
                log("  %s skipped (previous size failed)" % k)
                continue
            if prev and growth_guard and n >= 30000 and prev[1].get("wall", 0) > 60:
                R["full"][k] = {"skipped": "10k took %.0fs > 60s" % prev[1]["wall"]}
                log("  %s skipped" % k)
                continue
            if prev and growth_guard:
                pred = prev[1]["wall"] * (n / prev[0]) ** 2
                if pred > 2 * STEP_TIMEOUT:
                    R["full"][k] = {"skipped": "predicted %.0fs (quadratic from %d)" % (pred, prev[0])}
                    log("  %s skipped, predicted %.0fs" % (k, pred))
                    continue
            payload = write_payload("full.txt", mk_payload(n))
            runs = []
            reps = reps_for(n)
            for i in range(reps):
                r = load_time(mode, payload, flush=flush,
                              verify=expected_nat_rules(n, layout) if i == 0 else None)
                runs.append(r)
                if r["timeout"] or r["rc"] != 0:
                    break
                if r["wall"] > 30:   # one slow sample is enough
                    break
            s = summarize(runs)
            R["full"][k] = s
            log("  %-32s %s" % (k, fmt(s)))
            prev = (n, s)
            os.unlink(payload)

    for mode in MODES:
        # 1. what vipd will do: one-shot --noflush into an empty namespace
        series("kp-noflush", mode, lambda n: gen.full(A(n=n)), "kp")
        # reference: full flushing restore
        series("kp-flush", mode, lambda n: gen.full(A(n=n)), "kp", flush=True,
               sizes=[1000, 10000, 30000] if not quick else [1000, 10000])
        # flat layout (fewer chains)
        series("flat-noflush", mode, lambda n: gen.full(A(n=n, layout="flat")), "flat",
               sizes=[1000, 10000, 30000] if not quick else [1000, 10000])
    # nft-only workarounds for the O(chains^2) restore cache request
    for trick in ("S",):
        series("kp-noflush+%s" % trick, "nft", lambda n: gen.full(A(n=n, cache_trick=trick)), "kp",
               sizes=[1000, 10000, 30000] if not quick else [1000, 10000])
        series("flat-noflush+%s" % trick, "nft", lambda n: gen.full(A(n=n, layout="flat", cache_trick=trick)), "flat",
               sizes=[1000, 10000, 30000] if not quick else [1000, 10000])
    series("kp-noflush+Z", "nft", lambda n: gen.full(A(n=n, cache_trick="Z")), "kp",
           sizes=[10000])
    # bottom-up chunked load (trie layout), K services per restore call
    for mode in MODES:
        for K in (512,):
            for n in ([1000, 10000, 30000] if not quick else [1000, 10000]):
                k = "trie-chunked%d|%s|%d" % (K, mode, n)
                files = []
                for j, o in enumerate(gen.chunks(A(n=n, layout="trie", chunk=K))):
                    files.append(write_payload("chunk%03d.txt" % j, o))
                runs = []
                for i in range(REPS_BIG):
                    r = chunked_load_time(mode, files, verify=expected_nat_rules(n, "trie") if i == 0 else None)
                    runs.append(r)
                    if r["rc"] != 0 or r["timeout"]:
                        break
                s = summarize(runs)
                s["calls"] = len(files)
                R["full"][k] = s
                log("  %-32s %s  (%d restore calls)" % (k, fmt(s), len(files)))
                for fpath in files:
                    os.unlink(fpath)


def loaded_ns(mode, n, layout, hooks="both"):
    """Namespace with n services loaded (flushing restore into an empty
    namespace == same end state as --noflush, but fast for nft)."""
    ns = ns_new()
    o = gen.full(A(n=n, layout=layout, no_hooks=(hooks != "both")))
    if hooks == "pre":
        o.insert(o.index("COMMIT"), "-A PREROUTING -j VIPD-SERVICES")
    p = write_payload("base.txt", o)
    r = run(BIN[mode]["restore"], ns=ns, stdin=p, timeout=max(STEP_TIMEOUT, 600))
    os.unlink(p)
    if r["rc"] != 0:
        raise RuntimeError("base load failed: %s" % r["stderr"])
    return ns, r


def partial_series(mode, ns, n, layout, variant, reps=REPS, svc=None, gen0=1):
    runs = []
    for i in range(reps):
        g = gen0 + i
        p = write_payload("partial.txt", gen.partial(A(n=n, layout=layout, variant=variant, gen=g, svc=svc)))
        runs.append(run(BIN[mode]["restore"] + ["--noflush"], ns=ns, stdin=p))
    return summarize(runs)


def sec_partial(quick):
    log("partial updates at 10k")
    R.setdefault("partial", {})
    R.setdefault("reads", {})
    n = 10000
    plan = {
        "kp": ["noop", "append", "svc", "svc-flush", "svc-newsep", "svc+services", "svc-S"],
        "trie": ["svc", "svc+bucket", "svc+services"],
        "flat": ["svc", "svc+bucket"],
    }
    for mode in MODES:
        for layout, variants in plan.items():
            ns, base = loaded_ns(mode, n, layout)
            try:
                got, chains = count_rules(mode, ns)
                R["partial"]["base|%s|%s" % (mode, layout)] = {
                    "load_flush_wall": base["wall"], "nat_rules": got, "nat_chains": chains}
                log("  base %s %s: %d rules %d chains (flush-load %.2fs)" % (mode, layout, got, chains, base["wall"]))
                for v in variants:
                    s = partial_series(mode, ns, n, layout, v)
                    R["partial"]["%s|%s|%s" % (layout, v, mode)] = s
                    log("  %-26s %-7s %s" % (layout + "/" + v, mode, fmt(s)))
                # state was changed by the partials: verify still consistent
                got2, _ = count_rules(mode, ns)
                R["partial"]["after|%s|%s" % (mode, layout)] = got2
                if layout in ("kp", "trie"):
                    reads(mode, ns, layout)
                resync(mode, ns, n, layout)
            finally:
                ns_del(ns)


def resync(mode, ns, n, layout):
    """vipd restart: re-apply every service over an already loaded table
    (hooks already present, so the payload carries none)."""
    if layout == "trie":
        files = [write_payload("rs%03d.txt" % j, o)
                 for j, o in enumerate(gen.chunks(A(n=n, layout="trie", chunk=512, no_hooks=True)))]
        key = "trie-chunked512"
    else:
        trick = "S" if mode == "nft" else "none"
        files = [write_payload("rs.txt", gen.full(A(n=n, layout=layout, no_hooks=True, cache_trick=trick)))]
        key = layout + ("+S" if trick == "S" else "")
    runs = []
    for _ in range(REPS_BIG):
        tot = {"wall": 0.0, "user": 0.0, "sys": 0.0, "rc": 0, "timeout": False, "stderr": ""}
        for fpath in files:
            r = run(BIN[mode]["restore"] + ["--noflush"], ns=ns, stdin=fpath)
            for k2 in ("wall", "user", "sys"):
                tot[k2] += r[k2]
            if r["rc"] != 0 or r["timeout"]:
                tot.update(rc=r["rc"], timeout=r["timeout"], stderr=r["stderr"])
                break
        runs.append(tot)
        if tot["rc"] != 0 or tot["timeout"]:
            break
    s = summarize(runs)
    s["calls"] = len(files)
    R["partial"]["resync|%s|%s" % (key, mode)] = s
    got, _ = count_rules(mode, ns)
    s["nat_rules_after"] = got
    log("  resync %-20s %-7s %s (%d calls, %d rules after)" % (key, mode, fmt(s), len(files), got))
    for fpath in files:
        os.unlink(fpath)


def reads(mode, ns, layout):
    k = "%s|%s" % (layout, mode)
    R["reads"]["save-nat|" + k] = summarize(
        [run(BIN[mode]["save"] + ["-t", "nat"], ns=ns) for _ in range(REPS_BIG)])
    R["reads"]["C-hook|" + k] = summarize(
        [run(BIN[mode]["ipt"] + ["-t", "nat", "-C", "PREROUTING", "-j", "VIPD-SERVICES"], ns=ns)
         for _ in range(REPS)])
    R["reads"]["C-missing|" + k] = summarize(
        [run(BIN[mode]["ipt"] + ["-t", "nat", "-C", "PREROUTING", "-m", "comment", "--comment", "nope",
                                 "-j", "VIPD-SERVICES"], ns=ns) for _ in range(REPS)], ok_rc=(1,))
    # -C on a missing rule exits 1: that is the expected answer
    ins, dels = [], []
    for i in range(REPS):
        spec = ["-m", "comment", "--comment", "vipd-hook-%d" % i, "-j", "VIPD-SERVICES"]
        ins.append(run(BIN[mode]["ipt"] + ["-t", "nat", "-I", "PREROUTING"] + spec, ns=ns))
        dels.append(run(BIN[mode]["ipt"] + ["-t", "nat", "-D", "PREROUTING"] + spec, ns=ns))
    R["reads"]["I-hook|" + k] = summarize(ins)
    R["reads"]["D-hook|" + k] = summarize(dels)
    R["reads"]["S-chain|" + k] = summarize(
        [run(BIN[mode]["ipt"] + ["-t", "nat", "-S", gen.svc_chain(42)], ns=ns) for _ in range(REPS)])
    R["reads"]["S-prerouting|" + k] = summarize(
        [run(BIN[mode]["ipt"] + ["-t", "nat", "-S", "PREROUTING"], ns=ns) for _ in range(REPS)])
    for key in ("save-nat", "C-hook", "I-hook", "D-hook", "S-chain", "S-prerouting"):
        log("  read %-10s %-5s %-7s %s" % (key, layout, mode, fmt(R["reads"][key + "|" + k])))
    log("  read C-missing %-5s %-7s %s (rc 1 expected)" % (layout, mode, fmt(R["reads"]["C-missing|" + k])))


def strace_summary(ns, argv, stdin):
    """Count syscalls + bytes received from the kernel for one run."""
    out = tmp("strace.txt")
    full = ["ip", "netns", "exec", ns, "strace", "-f", "-qq", "-o", out,
            "-e", "trace=sendmsg,recvmsg,sendto,recvfrom,getsockopt,setsockopt"] + argv
    with open(stdin) as fin:
        subprocess.run(full, stdin=fin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=STEP_TIMEOUT)
    cnt, rbytes, sbytes = {}, 0, 0
    with open(out) as f:
        for ln in f:
            m = re.match(r"\d+\s+(\w+)\(.*\)\s+=\s+(-?\d+)", ln)
            if not m:
                continue
            sc, ret = m.group(1), int(m.group(2))
            cnt[sc] = cnt.get(sc, 0) + 1
            if sc in ("recvmsg", "recvfrom") and ret > 0:
                rbytes += ret
            if sc in ("sendmsg", "sendto") and ret > 0:
                sbytes += ret
            if sc == "getsockopt":
                m2 = re.search(r"\[(\d+)\]\)\s+=", ln)
                if m2:
                    rbytes += int(m2.group(1))
            if sc == "setsockopt":
                m2 = re.search(r",\s*(\d+)\)\s+=", ln)
                if m2:
                    sbytes += int(m2.group(1))
    os.unlink(out)
    return {"calls": cnt, "recv_bytes": rbytes, "send_bytes": sbytes}


def sec_diag(quick):
    log("diagnostics")
    D = R.setdefault("diag", {})
    # (a) partial one-service cost vs total size, both modes
    sizes = [1000, 5000, 10000, 20000] if not quick else [1000, 10000]
    for mode in MODES:
        for n in sizes:
            ns, _ = loaded_ns(mode, n, "kp")
            try:
                s = partial_series(mode, ns, n, "kp", "svc", reps=REPS_BIG)
                D["svc-vs-n|%s|%d" % (mode, n)] = s
                log("  svc-vs-n %-6s %6d %s" % (mode, n, fmt(s)))
            finally:
                ns_del(ns)
    # (b) hooks: the kernel re-validates every chain reachable from a base
    # chain on each commit -> cost scales with (#hook entry points x rules)
    for hooks in ("none", "pre", "both"):
        for mode in MODES:
            ns, _ = loaded_ns(mode, 10000, "kp", hooks=hooks)
            try:
                s = partial_series(mode, ns, 10000, "kp", "svc", reps=REPS)
                D["hooks|%s|%s" % (hooks, mode)] = s
                log("  hooks=%-4s %-6s svc partial %s" % (hooks, mode, fmt(s)))
            finally:
                ns_del(ns)
    # (c) chain declarations only: ascending vs descending name order (nft's
    # restore inserts every named chain into a sorted linked list)
    for order in ("asc", "desc", "hash"):
        for mode in MODES:
            c = 60000
            p = write_payload("decl.txt", gen.decl_only(argparse.Namespace(n=c, order=order)))
            s = summarize([load_time(mode, p, timeout=STEP_TIMEOUT)])
            D["decl|%s|%s|%d" % (order, mode, c)] = s
            log("  decl-only %d chains %-4s %-6s %s" % (c, order, mode, fmt(s)))
    # (d) same number of rules, few vs many chains
    for chains in (1, 100, 10000):
        for mode in MODES:
            p = write_payload("spread.txt", gen.rules_spread(argparse.Namespace(n=40000, chains=chains)))
            s = summarize([load_time(mode, p) for _ in range(REPS_BIG if chains < 10000 else 1)])
            D["spread|%d|%s" % (chains, mode)] = s
            log("  40000 rules over %5d chains %-6s %s" % (chains, mode, fmt(s)))
    # (e) what crosses the netlink / sockopt boundary for a partial at 10k
    for mode in MODES:
        ns, _ = loaded_ns(mode, 10000, "kp")
        try:
            for v in ("noop", "svc", "svc+services"):
                p = write_payload("st.txt", gen.partial(A(n=10000, variant=v, gen=50)))
                st = strace_summary(ns, BIN[mode]["restore"] + ["--noflush"], p)
                D["strace|%s|%s" % (v, mode)] = st
                log("  strace %-13s %-6s %s" % (v, mode, st))
        finally:
            ns_del(ns)
    # (f) where nft's userspace time goes: strcmp calls (ltrace) for a kp
    # noflush load of 50 and 100 services, and with the -S cache trick
    if shutil.which("ltrace"):
        for n, trick in ((50, "none"), (100, "none"), (100, "S")):
            p = write_payload("lt.txt", gen.full(A(n=n, cache_trick=trick)))
            ns = ns_new()
            try:
                out = tmp("ltrace.txt")
                with open(p) as fin:
                    subprocess.run(["ip", "netns", "exec", ns, "ltrace", "-c", "-e", "strcmp",
                                    "-o", out, "iptables-nft-restore", "--noflush"],
                                   stdin=fin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=STEP_TIMEOUT)
                calls = None
                with open(out) as f:
                    for ln in f:
                        if ln.strip().endswith("strcmp"):
                            calls = int(ln.split()[3])
                D["ltrace-strcmp|%d|%s" % (n, trick)] = calls
                log("  ltrace strcmp calls, kp n=%d trick=%s: %s" % (n, trick, calls))
            except subprocess.TimeoutExpired:
                D["ltrace-strcmp|%d|%s" % (n, trick)] = "timeout"
            finally:
                ns_del(ns)


def sec_extra(quick):
    """Follow-ups: chunked load of the flat layout, and batching many
    service changes into one restore."""
    log("extra")
    X = R.setdefault("extra", {})
    for mode in MODES:
        for n in ([10000, 30000] if not quick else [10000]):
            files = [write_payload("xchunk%03d.txt" % j, o)
                     for j, o in enumerate(gen.chunks(A(n=n, layout="flat", chunk=512)))]
            runs = []
            for i in range(REPS_BIG):
                r = chunked_load_time(mode, files, verify=expected_nat_rules(n, "flat") if i == 0 else None)
                runs.append(r)
                if r["rc"] != 0 or r["timeout"] or r["wall"] > 60:
                    break
            s = summarize(runs)
            s["calls"] = len(files)
            X["flat-chunked512|%s|%d" % (mode, n)] = s
            log("  flat-chunked512 %-6s %6d %s (%d calls)" % (mode, n, fmt(s), len(files)))
            for fpath in files:
                os.unlink(fpath)
    for mode in MODES:
        for layout in ("kp", "trie", "flat"):
            ns, _ = loaded_ns(mode, 10000, layout)
            try:
                for v in ("svc", "svc100"):
                    s = partial_series(mode, ns, 10000, layout, v, reps=REPS)
                    X["batch|%s|%s|%s" % (layout, v, mode)] = s
                    log("  batch %-5s %-7s %-6s %s" % (layout, v, mode, fmt(s)))
            finally:
                ns_del(ns)


def root_snapshot():
    """Root namespace rules (read-only): used to prove we changed nothing."""
    out = []
    for c in (["iptables-nft-save"], ["iptables-legacy-save"], ["nft", "list", "ruleset"]):
        try:
            p = subprocess.run(c, capture_output=True, text=True, timeout=120)
            out.append("--- %s\n" % c[0] + "\n".join(
                ln for ln in p.stdout.splitlines() if not ln.startswith("#")))
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append("--- %s: %s" % (c[0], e))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="env,features,full,partial,diag,extra")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("must run as root (creates network namespaces)")
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _sig)
    atexit.register(cleanup)
    before = root_snapshot()
    State.tmpdir = tempfile.mkdtemp(prefix="vipdmeas-")
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = os.path.join(args.out, "results-%s.json" % stamp)
    R["meta"] = {"argv": sys.argv, "step_timeout": STEP_TIMEOUT, "reps": REPS, "reps_big": REPS_BIG}
    t0 = time.time()
    try:
        for sec in args.only.split(","):
            {"env": sec_env, "features": sec_features,
             "full": lambda: sec_full(args.quick), "partial": lambda: sec_partial(args.quick),
             "diag": lambda: sec_diag(args.quick), "extra": lambda: sec_extra(args.quick)}[sec]()
            with open(out, "w") as f:
                json.dump(R, f, indent=1, sort_keys=True)
    finally:
        R["meta"]["elapsed_s"] = time.time() - t0
        R["meta"]["loadavg_end"] = open("/proc/loadavg").read().strip()
        with open(out, "w") as f:
            json.dump(R, f, indent=1, sort_keys=True)
        cleanup()
        log("results: %s (%.0fs)" % (out, time.time() - t0))
        link = os.path.join(args.out, "latest.json")
        try:
            if os.path.islink(link) or os.path.exists(link):
                os.unlink(link)
            os.symlink(os.path.basename(out), link)
        except OSError:
            pass
        left = [ln for ln in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                            text=True).stdout.splitlines()
                if ln.startswith("vipdmeas-%d-" % os.getpid())]
        log("our namespaces left: %s" % (left or "none"))
        after = root_snapshot()
        if after == before:
            log("root namespace rules unchanged (iptables-nft-save, iptables-legacy-save, nft list ruleset)")
        else:
            log("NOTE: root namespace rules differ from the start of the run "
                "(another process on this host?); diff:")
            import difflib
            for ln in list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm=""))[:40]:
                print("   ", ln)
        try:
            import report
            with open(os.path.join(args.out, "latest-tables.md"), "w") as f:
                sys.stdout.flush()
                old = sys.stdout
                sys.stdout = f
                try:
                    sys.argv = ["report.py", out]
                    report.main()
                finally:
                    sys.stdout = old
            log("tables: %s" % os.path.join(args.out, "latest-tables.md"))
        except Exception as e:  # report problems must not hide the run
            log("report failed: %r" % e)


if __name__ == "__main__":
    main()
