package ebpf

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/nsdo"
)

var _ dataplane.DriftDetector = (*Dataplane)(nil)

// Drift labels (dataplane.Drift.What) of the eBPF dataplane.
const (
	// driftTCLink: a pod interface lacks vipd's tc program (a tcx link
	// detached or unpinned, a clsact filter or qdisc deleted).
	driftTCLink = "tc-link"
	// driftCgroupLink: a socket hook is not attached to the cgroup, or
	// its link's pin is gone.
	driftCgroupLink = "cgroup-link"
	// driftMap: a map's pin is gone or names another map than vipd's.
	driftMap = "map"
	// driftMapEntries: a service map holds entries vipd did not write, or
	// lacks some it did.
	driftMapEntries = "map-entries"
)

// entryCheckShare bounds the time DetectDrift spends reading the service
// maps: it compares their contents at most once per entryCheckShare times
// the duration of the last comparison, so that with a million entries the
// check stays a small share of a CPU, while a small node checks every time.
const entryCheckShare = 20

// DriftKinds implements dataplane.DriftDetector.
func (d *Dataplane) DriftKinds() []string {
	return []string{driftTCLink, driftCgroupLink, driftMap, driftMapEntries}
}

// DetectDrift implements dataplane.DriftDetector. Every time, it checks
// that each pod interface has vipd's tc programs, that the cgroup has the
// socket hooks and their pinned links, and that each map's pin names the
// map vipd holds (by map ID). It also compares the service maps' entries
// with what vipd wrote, as often as entryCheckShare allows. Before the
// first successful Apply it reports nothing: nothing is attached yet.
// Attachment gaps that a repair failed to close are not reported again
// until the repair's backoff (repairBackoff) ends.
//
// The entry comparison reads the maps without holding the apply lock, on a
// copy of what vipd wrote taken under it, so that Applies are not held up
// for its whole read; a difference it finds may be an Apply that ran
// meanwhile, so it is compared again under the lock before it is reported.
func (d *Dataplane) DetectDrift(ctx context.Context) ([]dataplane.Drift, error) {
	d.applyMu.Lock()
	if !d.attached {
		d.applyMu.Unlock()
		return nil, nil
	}
	drifts, _, err := d.checkAttachments()
	if err != nil {
		d.applyMu.Unlock()
		return nil, err
	}
	if key := gapKey(drifts); !d.repairs.due(key, time.Now()) {
		// A repair of exactly these gaps failed: Apply logged why, and
		// they are reported again when its backoff ends.
		drifts = nil
	}
	cfgDrift, err := d.checkConfig()
	if err != nil {
		d.applyMu.Unlock()
		return nil, err
	}
	if cfgDrift != nil {
		drifts = append(drifts, *cfgDrift)
	}
	extDrifts, err := d.checkExternalMaps()
	if err != nil {
		d.applyMu.Unlock()
		return nil, err
	}
	drifts = append(drifts, extDrifts...)
	var snap *entryCheck
	if time.Since(d.entriesChecked) >= entryCheckShare*d.entryCheckCost {
		snap = d.prog.snapshotEntries()
	}
	d.applyMu.Unlock()
	if snap != nil {
		if d.beforeEntryCompare != nil {
			d.beforeEntryCompare()
		}
		start := time.Now()
		c, err := snap.compare()
		if err == nil && c.any() {
			d.applyMu.Lock()
			c, err = d.prog.check()
			d.applyMu.Unlock()
		}
		if err != nil {
			return nil, fmt.Errorf("read service maps: %w", err)
		}
		d.applyMu.Lock()
		d.entriesChecked, d.entryCheckCost = time.Now(), time.Since(start)
		d.applyMu.Unlock()
		for i, n := range c {
			if n.added+n.fixed+n.removed > 0 {
				drifts = append(drifts, dataplane.Drift{What: driftMapEntries, Detail: fmt.Sprintf(
					"%s: %d entries missing, %d wrong, %d no service accounts for", serviceMapNames[i], n.added, n.fixed, n.removed)})
			}
		}
	}
	return drifts, nil
}

// attachGaps are the attachments checkAttachments found missing, for
// repair to redo.
type attachGaps struct {
	tc     map[int]string // pod interfaces, ifindex -> name
	ext    map[int]string // external interfaces, ifindex -> name
	cgroup bool
	maps   []string // names of the maps to pin again
}

func (g *attachGaps) any() bool {
	return len(g.tc) > 0 || len(g.ext) > 0 || g.cgroup || len(g.maps) > 0
}

// checkAttachments checks the map pins, the socket hooks and the tc
// programs, and returns what it found missing, as drifts and as gaps.
func (d *Dataplane) checkAttachments() ([]dataplane.Drift, *attachGaps, error) {
	gaps := &attachGaps{tc: map[int]string{}, ext: map[int]string{}}
	var drifts []dataplane.Drift
	for _, name := range pinnedMapNames {
		if detail := d.checkMapPin(name); detail != "" {
			drifts = append(drifts, dataplane.Drift{What: driftMap, Detail: detail})
			gaps.maps = append(gaps.maps, name)
		}
	}
	missing, err := checkCgroup(d.cfg.CgroupPath, d.linkDir(), cgroupHooks(&d.objs.bpfPrograms))
	if err != nil {
		return nil, nil, err
	}
	for _, m := range missing {
		drifts = append(drifts, dataplane.Drift{What: driftCgroupLink, Detail: m})
		gaps.cgroup = true
	}
	tc, err := d.tc.check()
	if err != nil {
		return nil, nil, err
	}
	for _, g := range tc {
		drifts = append(drifts, dataplane.Drift{What: driftTCLink, Detail: g.detail})
		gaps.tc[g.ifindex] = g.name
	}
	ext, err := d.ext.check()
	if err != nil {
		return nil, nil, err
	}
	for _, g := range ext {
		drifts = append(drifts, dataplane.Drift{What: driftTCLink, Detail: g.detail})
		gaps.ext[g.ifindex] = g.name
	}
	return drifts, gaps, nil
}

// repair redoes what checkAttachments found missing: it pins vipd's maps
// again (over whatever is pinned in their place), attaches the socket
// hooks again and the tc programs on the interfaces that lack them.
func (d *Dataplane) repair(gaps *attachGaps) error {
	maps := d.objs.bpfMaps.byName()
	for _, name := range gaps.maps {
		pin := filepath.Join(d.cfg.BPFFS, name)
		m := maps[name]
		// Unpin removes whatever is at the map's pin path (the map was
		// loaded pinned there), and forgets the path, so that Pin pins
		// again rather than taking the map for pinned there already.
		if err := m.Unpin(); err != nil {
			return fmt.Errorf("unpin %s: %w", name, err)
		}
		if err := m.Pin(pin); err != nil {
			return fmt.Errorf("pin %s again: %w", name, err)
		}
	}
	if gaps.cgroup {
		if err := attachCgroup(d.cfg.CgroupPath, d.linkDir(), cgroupHooks(&d.objs.bpfPrograms)); err != nil {
			return err
		}
	}
	var errs []error
	for ifindex, name := range gaps.tc {
		err := d.tc.attach(ifindex, name)
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
			continue // the pod went away meanwhile
		}
		errs = append(errs, err)
	}
	for ifindex, name := range gaps.ext {
		err := d.ext.attach(ifindex, name)
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// pinnedMapNames are the maps pinned in the bpffs directory.
var pinnedMapNames = func() []string {
	var names []string
	for name := range (&bpfMaps{}).byName() {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}()

// byName returns the maps by their names in the bpffs directory: all of
// them are pinned (LIBBPF_PIN_BY_NAME in bpf/maps.h).
func (m *bpfMaps) byName() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		"vipd_affinity": m.VipdAffinity, "vipd_backends": m.VipdBackends, "vipd_config": m.VipdConfig,
		"vipd_ct": m.VipdCt, "vipd_ct_srcs": m.VipdCtSrcs, "vipd_event_drops": m.VipdEventDrops, "vipd_events": m.VipdEvents,
		"vipd_ids": m.VipdIds, "vipd_maglev": m.VipdMaglev, "vipd_members": m.VipdMembers,
		"vipd_revnat": m.VipdRevnat, "vipd_services": m.VipdServices, "vipd_snat_stats": m.VipdSnatStats, "vipd_snat_tw": m.VipdSnatTw,
		"vipd_sock_conn": m.VipdSockConn, "vipd_sock_revnat": m.VipdSockRevnat,
		"vipd_sock_udp": m.VipdSockUdp, "vipd_svc_addrs": m.VipdSvcAddrs,
	}
}

// checkMapPin returns what is wrong with the pin of the map name, or "".
func (d *Dataplane) checkMapPin(name string) string {
	pin := filepath.Join(d.cfg.BPFFS, name)
	m, err := ebpf.LoadPinnedMap(pin, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return name + ": pin " + pin + " removed"
	}
	if err != nil {
		return fmt.Sprintf("%s: pin %s unreadable: %v", name, pin, err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return fmt.Sprintf("%s: pin %s unreadable: %v", name, pin, err)
	}
	id, _ := info.ID()
	if want := d.mapIDs[name]; id != want {
		return fmt.Sprintf("%s: pin %s names map %d, not vipd's map %d", name, pin, id, want)
	}
	return ""
}

// mapIDs returns the kernel IDs of the maps, by name.
func mapIDs(m *bpfMaps) (map[string]ebpf.MapID, error) {
	ids := map[string]ebpf.MapID{}
	for name, m := range m.byName() {
		info, err := m.Info()
		if err != nil {
			return nil, fmt.Errorf("map %s info: %w", name, err)
		}
		ids[name], _ = info.ID()
	}
	return ids, nil
}

// programID returns p's kernel ID, or 0.
func programID(p *ebpf.Program) ebpf.ProgramID {
	info, err := p.Info()
	if err != nil {
		return 0
	}
	id, _ := info.ID()
	return id
}

// checkCgroup returns, one line each, the socket hooks whose program is
// not attached to the cgroup at cgroupPath, or whose link is not pinned
// in linkDir.
func checkCgroup(cgroupPath, linkDir string, hooks []cgroupHook) ([]string, error) {
	fd, err := unix.Open(cgroupPath, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", cgroupPath, err)
	}
	defer unix.Close(fd)
	var out []string
	for _, h := range hooks {
		res, err := link.QueryPrograms(link.QueryOptions{Target: fd, Attach: h.attach})
		if err != nil {
			return nil, fmt.Errorf("query the %s hook of cgroup %s: %w", h.name, cgroupPath, err)
		}
		if !hasProgram(res, programID(h.prog)) {
			out = append(out, fmt.Sprintf("cgroup %s %s: vipd_sock_%s not attached", cgroupPath, h.name, h.name))
			continue
		}
		if _, err := os.Stat(filepath.Join(linkDir, "cgroup_"+h.name)); err != nil {
			out = append(out, fmt.Sprintf("cgroup %s %s: link pin missing (%v)", cgroupPath, h.name, err))
		}
	}
	return out, nil
}

func hasProgram(res *link.QueryResult, id ebpf.ProgramID) bool {
	for _, p := range res.Programs {
		if p.ID == id {
			return true
		}
	}
	return false
}

// tcGap is a direction of a pod interface without vipd's program.
type tcGap struct {
	ifindex int
	name    string
	detail  string
}

// unprocessedGrace is how long a pod interface may exist before the
// watcher has tried to attach to it, before check reports it: a new veth
// is listed from its RTM_NEWLINK on, a moment before the watcher gets to it.
const unprocessedGrace = 2 * time.Second

// check lists the directions of the namespace's pod interfaces that lack
// vipd's program: with tcx, not attached or its link not pinned; with
// clsact, no vipd filter running it.
//
// It holds the attacher's lock throughout, so that it never sees an
// attach half done (a tcx link attached but not pinned yet). It checks the
// interfaces the attacher has attached to or failed on; one it has not
// processed yet is reported only once it stayed so for unprocessedGrace
// (a watcher that missed it), not while a pod is being created.
func (a *tcAttacher) check() ([]tcGap, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	useTCX := a.useTCX
	var gaps []tcGap
	now := time.Now()
	unprocessed := map[int]time.Time{}
	defer func() { a.unprocessed = unprocessed }()
	err := nsdo.Do(a.netns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list interfaces: %w", err)
		}
		for _, l := range links {
			attrs := l.Attrs()
			if !a.matches(attrs.Name) {
				continue
			}
			_, attached := a.attached[attrs.Index]
			_, failed := a.failed[attrs.Index]
			if !attached && !failed {
				first, ok := a.unprocessed[attrs.Index]
				if !ok {
					first = now
				}
				unprocessed[attrs.Index] = first
				if now.Sub(first) < unprocessedGrace {
					continue
				}
			}
			for _, d := range []struct {
				dir    string
				tcx    ebpf.AttachType
				parent uint32
				prog   *ebpf.Program
				name   string
			}{
				{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS, a.ingress, a.progNames[0]},
				{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS, a.egress, a.progNames[1]},
			} {
				gap := func(what string) {
					gaps = append(gaps, tcGap{ifindex: attrs.Index, name: attrs.Name,
						detail: fmt.Sprintf("%s %s: %s", attrs.Name, d.dir, what)})
				}
				id := programID(d.prog)
				if !useTCX {
					has, err := hasClsactFilter(l, d.parent, id)
					if err != nil {
						return err
					}
					if !has {
						gap(d.name + " not attached (no vipd clsact filter)")
					}
					continue
				}
				res, err := link.QueryPrograms(link.QueryOptions{Target: attrs.Index, Attach: d.tcx})
				if errors.Is(err, unix.ENODEV) {
					break // the interface went away
				}
				if err != nil {
					return fmt.Errorf("query the tcx programs of %s %s: %w", attrs.Name, d.dir, err)
				}
				if !hasProgram(res, id) {
					gap(d.name + " not attached")
				} else if _, err := os.Stat(a.pinPath(attrs.Index, d.dir)); err != nil {
					gap(fmt.Sprintf("tcx link pin missing (%v)", err))
				}
			}
		}
		return nil
	})
	return gaps, err
}

// hasClsactFilter reports whether l has vipd's clsact filter running the
// program id at parent. An interface without a clsact qdisc has none; an
// interface gone meanwhile is not reported; other errors are returned.
func hasClsactFilter(l netlink.Link, parent uint32, id ebpf.ProgramID) (bool, error) {
	qdiscs, err := netlink.QdiscList(l)
	if errors.Is(err, unix.ENODEV) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("list the qdiscs of %s: %w", l.Attrs().Name, err)
	}
	if !slices.ContainsFunc(qdiscs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" }) {
		return false, nil
	}
	filters, err := netlink.FilterList(l, parent)
	if errors.Is(err, unix.ENODEV) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("list the clsact filters of %s: %w", l.Attrs().Name, err)
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == filterName && bf.Id == int(id) {
			return true, nil
		}
	}
	return false, nil
}

// check compares the service maps with what vipd wrote into them, without
// writing: it returns what a full apply of the same state would change.
// The caller holds the apply lock.
func (p *programmer) check() (entryCounts, error) {
	return p.snapshotEntries().compare()
}

// entryCheck is a copy of what the service maps' comparison reads of the
// programmer (what vipd wrote), so that it can read the maps while Apply
// runs. The programmed frontends are shared: apply replaces them, never
// changes one in place.
type entryCheck struct {
	p       *programmer
	changes []change
	next    []*programmed
	offs    []int32
	nids    int
	// used are the referenced backends; the copy's backend table holds
	// the IPv6 ones alone (the IPv4 ones are in used whole).
	used *usedBackends
}

// snapshotEntries copies what compare needs. The caller holds the apply
// lock; the copy costs a pass over the frontends and the backend table,
// far less than reading the maps. Of the backend table it keeps what the
// audit reads (usedOf), not a copy: a fraction of its size.
func (p *programmer) snapshotEntries() *entryCheck {
	c := &entryCheck{
		p: &programmer{maps: p.maps, draining: maps.Clone(p.draining), noDrain: p.noDrain, nextBackend: p.nextBackend,
			backendIDs: backendTable{v6: maps.Clone(p.backendIDs.v6)}},
		changes: make([]change, 0, len(p.frontends)),
		next:    make([]*programmed, 0, len(p.frontends)),
		offs:    make([]int32, 0, len(p.frontends)),
		used:    usedOf(&p.backendIDs, p.nextBackend),
	}
	for k, pr := range p.frontends {
		c.changes = append(c.changes, change{key: k, fe: pr.fe})
		c.next = append(c.next, pr)
		c.offs = append(c.offs, int32(c.nids))
		c.nids += len(pr.memberIDs()) + len(pr.slotIDs())
	}
	return c
}

// compare reads the service maps and counts how they differ from the copy.
func (c *entryCheck) compare() (entryCounts, error) {
	au, err := c.p.auditMaps(c.changes, c.next, c.offs, c.nids, nil, c.used)
	if err != nil {
		return entryCounts{}, err
	}
	return au.counts(c.next, &c.p.backendIDs), nil
}
