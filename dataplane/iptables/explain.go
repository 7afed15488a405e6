package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/nsdo"
)

// ExplainFlow implements dataplane.Explainer. Only ClientIP session affinity
// is kernel state that decides a connection here (the random choice is
// not), so for a port with affinity it reads the xt_recent lists of the
// port's SEP chains in the dataplane's namespace
// (/proc/net/xt_recent/VIPD-SEP-*) in the order the SVC chain checks them:
// the first list that holds a live entry for the client's address is the
// backend the next connection gets. The zero Explanation means no such
// entry, or no affinity, or an address and port that vipd does not serve.
//
// The address may be a VIP, an external or LB IP, or a node-port address
// with a node port; for the last three the order is that of the cluster
// choice, which pods and the node get (the lists are the port's, whichever
// chain checks them). The drops (source ranges, the Local external
// policy without a node-local backend) follow from the desired state
// alone, and the server's Explain says them.
func (d *Dataplane) ExplainFlow(ctx context.Context, q dataplane.ExplainQuery) (dataplane.Explanation, error) {
	if err := ctx.Err(); err != nil {
		return dataplane.Explanation{}, err
	}
	type candidate struct {
		list    string
		backend netip.AddrPort
	}
	var (
		candidates []candidate
		timeout    time.Duration
	)
	client, vip := q.Client.Addr().Unmap(), q.VIP.Addr().Unmap()
	target := netip.AddrPortFrom(vip, q.VIP.Port())
	d.mu.Lock()
	for _, svc := range d.state {
		for _, p := range svc.Ports {
			if p.Protocol != q.Protocol {
				continue
			}
			fe, ok := servedAt(svc, p, d.nodePorts, target)
			if !ok {
				continue
			}
			f := FamilyOf(vip)
			if !svc.Affinity.ClientIP {
				continue
			}
			key := portKey(svc, p, f)
			backends := sortedEligible(svc, p, f)
			if fe.external {
				backends = sortedExternal(svc, p, f, dataplane.TrafficPolicyCluster)
			}
			// The order of the choice chain's --rcheck rules.
			for _, b := range backends {
				candidates = append(candidates, candidate{sepChain(key, b.IP), netip.AddrPortFrom(b.IP, b.TargetPort(p))})
			}
			timeout = time.Duration(max(1, int(svc.Affinity.Timeout.Seconds()))) * time.Second
		}
	}
	d.mu.Unlock()
	if client.Is4() != vip.Is4() {
		return dataplane.Explanation{}, nil
	}
	if len(candidates) == 0 {
		return dataplane.Explanation{}, nil
	}

	hz, err := kernelHZ()
	if err != nil {
		return dataplane.Explanation{}, fmt.Errorf("explain %s: %w", q.VIP, err)
	}
	lists := make([][]byte, len(candidates))
	var now uint64
	err = nsdo.In(d.ct.ns, func() error {
		for i, c := range candidates {
			b, err := os.ReadFile("/proc/thread-self/net/xt_recent/" + c.list)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			lists[i] = b
		}
		// After the lists, so that no entry looks younger than now.
		var err error
		now, err = jiffies()
		return err
	})
	if err != nil {
		return dataplane.Explanation{}, fmt.Errorf("explain %s: read affinity entries: %w", q.VIP, err)
	}
	window := uint64(math.Round(timeout.Seconds() * float64(hz)))
	for i, c := range candidates {
		seen, ok := lastSeen(lists[i], client)
		age := now - min(seen, now)
		// --rcheck --seconds matches an entry seen after now - window.
		if !ok || age > window {
			continue
		}
		left := time.Duration(window-age) * time.Second / time.Duration(hz)
		return dataplane.Explanation{AffinityBackend: c.backend, AffinityRemaining: left, Pick: c.backend}, nil
	}
	return dataplane.Explanation{}, nil
}

// servedAt returns the frontend of port p of svc at target, if p is served
// there with the node-port addresses nodePorts.
func servedAt(svc *dataplane.Service, p dataplane.Port, nodePorts []netip.Addr, target netip.AddrPort) (frontend, bool) {
	for _, fe := range frontends(svc, p, nodePorts) {
		if fe.addr == target {
			return fe, true
		}
	}
	return frontend{}, false
}

// lastSeen finds addr in the text of an xt_recent list, whose lines read
//
//	src=10.0.0.1 ttl: 64 last_seen: 4295012345 oldest_pkt: 1 4295012345
//
// and returns when it was last seen, in jiffies.
func lastSeen(list []byte, addr netip.Addr) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || !strings.HasPrefix(fields[0], "src=") || fields[3] != "last_seen:" {
			continue
		}
		a, err := netip.ParseAddr(strings.TrimPrefix(fields[0], "src="))
		if err != nil || a.Unmap() != addr {
			continue
		}
		seen, err := strconv.ParseUint(fields[4], 10, 64)
		return seen, err == nil
	}
	return 0, false
}

// jiffies reads the kernel's tick counter, which xt_recent stamps its
// entries with, from /proc/timer_list (root only).
func jiffies() (uint64, error) {
	f, err := os.Open("/proc/timer_list")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "jiffies: "); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("no jiffies in /proc/timer_list")
}

// kernelHZ is the kernel's tick rate (CONFIG_HZ), which user space has no
// interface for: measured once, over 100 ms of jiffies, and rounded to the
// nearest rate the kernel can be built with.
var kernelHZ = sync.OnceValues(func() (int, error) {
	j0, err := jiffies()
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	time.Sleep(100 * time.Millisecond)
	j1, err := jiffies()
	if err != nil {
		return 0, err
	}
	rate := float64(j1-j0) / time.Since(t0).Seconds()
	best := 0
	for _, hz := range []int{100, 250, 300, 1000} {
		if best == 0 || math.Abs(rate-float64(hz)) < math.Abs(rate-float64(best)) {
			best = hz
		}
	}
	return best, nil
})

var _ dataplane.Explainer = (*Dataplane)(nil)
