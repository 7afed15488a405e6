package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/ebpf/maglev"
	"github.com/vipd/vipd/dataplane/ebpf/sockdiag"
	"github.com/vipd/vipd/internal/cgroup2"
)

// Name is the dataplane's name.
const Name = "ebpf"

// DefaultBPFFS is where vipd pins its maps and links.
const DefaultBPFFS = "/sys/fs/bpf/vipd"

// Config configures the eBPF dataplane.
type Config struct {
	// NetNS is the path of the node's network namespace; empty means the
	// current one.
	NetNS string
	// BPFFS is the directory for pinned maps and links (a bpffs is mounted
	// there when it is on another file system). Default DefaultBPFFS.
	BPFFS string
	// CgroupPath is the cgroup v2 directory the socket hooks attach to.
	// Empty: the root of a cgroup2 mount at DefaultCgroupMount (mounted if
	// absent). Tests pass a child cgroup of their own.
	CgroupPath string
	// PodInterfaces are glob patterns of the host-side pod interfaces.
	// Default DefaultPodInterfaces.
	PodInterfaces []string
	// TCAttach is how the tc programs attach: TCAttachAuto (default),
	// TCAttachTCX or TCAttachClsact.
	TCAttach string
	// MaglevTableSize is the smallest Maglev table size M, a prime.
	// Default maglev.DefaultTableSize.
	MaglevTableSize uint32
	// Maps sizes the maps. Zero fields take DefaultMapSizes.
	Maps MapSizes
	// GCInterval is how often expired conntrack entries are deleted (and
	// their flows reported closed). Default 30s.
	GCInterval time.Duration
	// ConntrackTimeouts are the conntrack lifetimes. Zero fields take
	// DefaultConntrackTimeouts.
	ConntrackTimeouts ConntrackTimeouts
	// SNATPorts are the source ports external flows under policy Cluster
	// are masqueraded to, less the namespace's ip_local_port_range (read
	// once, by New), from which the node's own connections take theirs.
	// Zero takes DefaultSNATPorts. New fails when no port is left.
	SNATPorts PortRange
}

// PortRange is an inclusive range of ports.
type PortRange struct{ Min, Max uint16 }

// DefaultSNATPorts are 1024-65535; with Linux's default
// ip_local_port_range (32768-60999) taken out, SNAT hands out 1024-32767
// and 61000-65535, 36,280 ports per backend address and port (netfilter's
// MASQUERADE takes from the same space). Why that is safe from the node's
// own sockets:
//   - a connect() or an unbound send picks its source port inside
//     ip_local_port_range only (which New reads and SNAT skips);
//   - a listening socket, or a connected one, on a port of the range (a
//     server, a client that bound a port by hand) is found by the
//     programs' socket lookup (bpf_sk_lookup) for the backend's address
//     and port, and that port is skipped;
//   - ports below 1024 are left out: bindresvport() and the like take
//     them by hand for a connection made later, which the lookup cannot
//     foresee.
//
// What stays possible is a socket that binds a port of the range by hand
// and only then connects to a backend address and port an external flow
// uses through that same port: narrow SNATPorts to leave such ports out.
// The node-port range (30000-32767) needs no care: the programs match
// replies by the conntrack before they look for a frontend.
var DefaultSNATPorts = PortRange{Min: 1024, Max: 65535}

// defaultLocalPorts is Linux's default ip_local_port_range, assumed when
// the namespace's cannot be read.
var defaultLocalPorts = PortRange{Min: 32768, Max: 60999}

// ConntrackTimeouts are how long a conntrack entry lives after its flow's
// last packet, by the flow's state. The programs count whole seconds:
// values are rounded up.
type ConntrackTimeouts struct {
	// TCPSyn is for a TCP flow whose backend has not answered yet.
	TCPSyn time.Duration
	// TCPEstablished is for an answered TCP flow.
	TCPEstablished time.Duration
	// TCPClose is for a TCP flow after a FIN or RST.
	TCPClose time.Duration
	// Other is for UDP and SCTP flows.
	Other time.Duration
}

// DefaultConntrackTimeouts are kube-proxy's nf_conntrack settings (and
// CT_* in bpf/maps.h).
var DefaultConntrackTimeouts = ConntrackTimeouts{
	TCPSyn:         60 * time.Second,
	TCPEstablished: 24 * time.Hour,
	TCPClose:       10 * time.Second,
	Other:          60 * time.Second,
}

func (c *Config) setDefaults() {
	if c.BPFFS == "" {
		c.BPFFS = DefaultBPFFS
	}
	if len(c.PodInterfaces) == 0 {
		c.PodInterfaces = DefaultPodInterfaces
	}
	if c.TCAttach == "" {
		c.TCAttach = TCAttachAuto
	}
	if c.MaglevTableSize == 0 {
		c.MaglevTableSize = maglev.DefaultTableSize
	}
	d := DefaultMapSizes
	for _, f := range []struct{ v, def *uint32 }{
		{&c.Maps.LB, &d.LB}, {&c.Maps.Backends, &d.Backends}, {&c.Maps.Conntrack, &d.Conntrack},
		{&c.Maps.Affinity, &d.Affinity}, {&c.Maps.Sockets, &d.Sockets}, {&c.Maps.Events, &d.Events},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	if c.SNATPorts == (PortRange{}) {
		c.SNATPorts = DefaultSNATPorts
	}
	if c.GCInterval == 0 {
		c.GCInterval = 30 * time.Second
	}
	ct, dct := &c.ConntrackTimeouts, DefaultConntrackTimeouts
	for _, f := range []struct{ v, def *time.Duration }{
		{&ct.TCPSyn, &dct.TCPSyn}, {&ct.TCPEstablished, &dct.TCPEstablished},
		{&ct.TCPClose, &dct.TCPClose}, {&ct.Other, &dct.Other},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
}

// Dataplane is the eBPF dataplane. See the package documentation.
type Dataplane struct {
	log  hclog.Logger
	cfg  Config
	objs *bpfObjects
	prog *programmer

	needFull bool
	attached bool
	tc       *tcAttacher
	// ext attaches vipd_from_ext and vipd_to_ext to the external
	// interfaces of node, the Node of the last successful Apply.
	ext  *tcAttacher
	node dataplane.Node
	// srcRanges are the vipd_src_ranges entries written for each
	// frontend with source ranges.
	srcRanges map[feKey][]bpfSrcRangeKey

	// mapIDs are the kernel IDs of the maps, by name: DetectDrift compares
	// them with those of the maps pinned in the bpffs.
	mapIDs map[string]ebpf.MapID
	// entriesChecked is when DetectDrift last compared the service maps'
	// entries with the state, and entryCheckCost how long that took.
	entriesChecked time.Time
	entryCheckCost time.Duration
	// repairs holds back attachment repairs that keep failing.
	repairs repairBackoff
	// config is the entry vipd wrote into vipd_config.
	config bpfConfig
	// beforeEntryCompare, if set (by tests), runs when DetectDrift has
	// copied what it compares the maps with and let go of applyMu.
	beforeEntryCompare func()

	// monoOffset is the wall clock minus CLOCK_MONOTONIC (the programs'
	// bpf_ktime_get_ns), in nanoseconds, taken once by New.
	monoOffset int64
	// watch is the running WatchFlows, if any: the collector hands it the
	// flows that time out.
	// applyMu serializes Apply and the collector's removal of drained
	// frontends: both change the programmer's state.
	applyMu sync.Mutex

	watchMu  sync.Mutex
	watch    *flowWatch
	closing  bool           // Close has begun: no new WatchFlows
	watchers sync.WaitGroup // running WatchFlows, which Close waits for

	// stopGC is closed by Close: it stops the collector and WatchFlows.
	stopGC chan struct{}
	wg     sync.WaitGroup
}

var (
	_ dataplane.Dataplane  = (*Dataplane)(nil)
	_ dataplane.FlowSource = (*Dataplane)(nil)
	_ dataplane.Explainer  = (*Dataplane)(nil)
)

// New loads the programs and the pinned maps (creating them on first use)
// and restores the IDs a previous vipd left in them. The programs an
// earlier start pinned are reused, not loaded again, when they are exactly
// what a load would give over these maps (see loadOrReusePrograms). The programs are
// attached by the first successful Apply, once the maps hold the state:
// a restarted vipd never exposes empty maps to traffic.
//
// It fails with a clear error when the kernel lacks what the dataplane
// needs (BPF, BTF-less CO-RE is not needed; tc BPF; cgroup v2 sock_addr
// hooks; SO_NETNS_COOKIE).
func New(ctx context.Context, log hclog.Logger, cfg Config) (*Dataplane, error) {
	cfg.setDefaults()
	switch cfg.TCAttach {
	case TCAttachAuto, TCAttachTCX, TCAttachClsact:
	default:
		return nil, fmt.Errorf("tc attach mode %q: use auto, tcx or clsact", cfg.TCAttach)
	}
	if cfg.MaglevTableSize < 3 || !maglev.IsPrime(cfg.MaglevTableSize) {
		return nil, fmt.Errorf("maglev table size %d is not a prime", cfg.MaglevTableSize)
	}
	if err := checkEventsSize(cfg.Maps.Events); err != nil {
		return nil, err
	}
	if cfg.SNATPorts.Min == 0 || cfg.SNATPorts.Min > cfg.SNATPorts.Max {
		return nil, fmt.Errorf("SNAT port range %d-%d: want 1 <= min <= max", cfg.SNATPorts.Min, cfg.SNATPorts.Max)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	spec, err := sizedSpec(cfg.Maps)
	if err != nil {
		return nil, err
	}
	// Supported checks the kernel, before anything is mounted or created,
	// with a test load of the largest program: about 0.4 s of verifier
	// work. Programs of this build pinned by an earlier start prove the
	// kernel runs them, and spare it.
	if !programsPinned(cfg.BPFFS, spec) {
		if err := Supported(); err != nil {
			return nil, err
		}
	}
	mounted, err := ensureBPFFS(log, cfg.BPFFS, hostMountNS)
	if err != nil {
		return nil, err
	}
	if mounted {
		log.Info("mounted bpffs", "path", cfg.BPFFS)
	}
	if cfg.CgroupPath == "" {
		if err := cgroup2.Mount(DefaultCgroupMount); err != nil {
			return nil, fmt.Errorf("mount cgroup2 at %s: %w", DefaultCgroupMount, err)
		}
		cfg.CgroupPath = DefaultCgroupMount
	}
	if ok, err := cgroup2.IsCgroup2(cfg.CgroupPath); err != nil || !ok {
		return nil, fmt.Errorf("cgroup path %s is not a cgroup v2 directory (err %v)", cfg.CgroupPath, err)
	}
	cookie, err := netnsCookie(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("network namespace cookie: %w", err)
	}
	skip, err := snatSkip(log, cfg.NetNS, cfg.SNATPorts)
	if err != nil {
		return nil, err
	}
	objs, inner, err := loadObjects(log, cfg.BPFFS, spec)
	if err != nil {
		return nil, err
	}
	d := &Dataplane{log: log, cfg: cfg, objs: objs, needFull: true, stopGC: make(chan struct{}), monoOffset: monoOffset(),
		config: configFor(cookie, cfg.ConntrackTimeouts, cfg.SNATPorts), srcRanges: map[feKey][]bpfSrcRangeKey{}}
	d.config.SnatSkipMin, d.config.SnatSkipMax = skip.Min, skip.Max
	if err := writeConfig(&objs.bpfMaps, d.config); err != nil {
		objs.Close()
		return nil, err
	}
	if d.mapIDs, err = mapIDs(&objs.bpfMaps); err != nil {
		objs.Close()
		return nil, err
	}
	d.prog = newProgrammer(log, &objs.bpfMaps, inner, cfg.MaglevTableSize)
	d.prog.onMembersRemoved = d.destroyStuckSockets
	if err := d.prog.restore(); err != nil {
		objs.Close()
		return nil, err
	}
	if n := len(d.prog.revNatIDs); n > 0 {
		log.Info("reusing pinned maps", "frontends", n, "backends", d.prog.backendIDs.len(), "bpffs", cfg.BPFFS)
	}
	d.tc = newTCAttacher(log, cfg.NetNS, cfg.PodInterfaces, d.linkDir(), cfg.TCAttach, objs.VipdFromPod, objs.VipdToPod)
	d.ext = newExtAttacher(log, cfg.NetNS, d.linkDir(), cfg.TCAttach, objs.VipdFromExt, objs.VipdToExt)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.gcLoop(cfg.GCInterval, d.stopGC)
	}()
	return d, nil
}

func (d *Dataplane) linkDir() string { return filepath.Join(d.cfg.BPFFS, "links") }

// Name implements dataplane.Dataplane.
func (d *Dataplane) Name() string { return Name }

// Capabilities implements dataplane.Dataplane: everything, Maglev and
// external traffic included.
func (d *Dataplane) Capabilities() dataplane.Capabilities {
	return dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom, dataplane.LoadBalancingMaglev},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP, dataplane.SCTP},
		External:      true,
	}
}

// Apply implements dataplane.Dataplane. Only the frontends of changed
// services are rewritten, each in make-before-break order. A full Apply
// (the first one, the one after an error, and any with a nil s.Changed)
// reads the maps, rewrites the entries that are missing or wrong, deletes
// what no service accounts for, pins vipd's maps again where another map
// took their place, and attaches the programs again where they are
// missing: it repairs whatever DetectDrift reports. It logs what it
// changed, at INFO, when it changed anything. A failed Apply rolls the
// maps back to the previously applied state.
func (d *Dataplane) Apply(ctx context.Context, s *dataplane.State) error {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	start := time.Now()
	// Node ports are served on the node's addresses: a change of the Node
	// rewrites every frontend.
	nodeChanged := !d.node.Equal(&s.Node)
	full := d.needFull || s.Changed == nil || nodeChanged
	changes, err := d.changesFor(s, full)
	if err != nil {
		return err
	}
	if err := d.makeRoom(changes); err != nil {
		return err
	}
	if err := d.preSrcRanges(changes); err != nil {
		d.needFull = true
		return err
	}
	if err := d.prog.apply(changes, full); err != nil {
		d.needFull = true
		if rerr := d.prog.rollback(); rerr != nil {
			d.log.Error("roll back after a failed apply", "error", rerr)
		}
		return err
	}
	if err := d.syncSrcRanges(changes, full); err != nil {
		d.needFull = true
		return err
	}
	if full {
		if err := d.syncExtIfaces(&s.Node); err != nil {
			d.needFull = true
			return err
		}
	}
	if nodeChanged {
		d.node = cloneNode(&s.Node)
		if err := d.ext.setInterfaces(s.Node.ExternalInterfaces(), d.attached); err != nil {
			d.needFull = true
			return err
		}
	}
	d.needFull = false
	repaired, err := d.attachOrRepair(full)
	if err != nil {
		d.needFull = true
		return err
	}
	if full && (d.prog.changed.any() || len(repaired) > 0) {
		d.logFullApply(repaired, start)
	}
	d.log.Debug("applied", "full", full, "frontends_changed", len(changes), "elapsed", time.Since(start))
	return nil
}

// changesFor returns the changes that program s: on a full apply every
// frontend of s and a removal of every other programmed one; else those of
// the services s.Changed names that differ from what is programmed, and
// removals of those they no longer have. It fails, changing nothing, on a
// service the dataplane cannot program.
//
// A frontend key belongs to one service at most: the store refuses a
// service that claims another's VIP, node port or external address
// (server/store/addrs.go). So no set of every desired key is built (a
// map of 100,000 frontends, 6 MB of garbage at each sync): only a key
// that leaves its service is looked for among the others', in case it
// moved.
func (d *Dataplane) changesFor(s *dataplane.State, full bool) ([]change, error) {
	names := s.Changed
	if full {
		names = make([]string, 0, s.Len()+len(d.prog.byService))
		for n := range s.All() {
			names = append(names, n)
		}
		for n := range d.prog.byService {
			if _, ok := s.Get(n); !ok {
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	for i := 1; i < len(names); i++ {
		if names[i] == names[i-1] {
			// A service named twice is one service (s.Changed belongs to
			// the caller: compact a copy).
			names = slices.Compact(slices.Clone(names))
			break
		}
	}
	svcs := make([]*dataplane.Service, 0, len(names))
	for _, name := range names {
		if svc, ok := s.Get(name); ok {
			svcs = append(svcs, svc)
		}
	}
	r, err := d.render(svcs, &s.Node)
	if err != nil {
		return nil, err
	}
	changes := make([]change, 0, len(r.fes))
	// Removals: the programmed frontends of the named services that their
	// service no longer has (svcs and rendered follow names' order), unless
	// another service took them.
	var gone map[feKey]bool
	i := 0
	for _, name := range names {
		var fes []*frontend
		if i < len(svcs) && svcs[i].Name == name {
			fes = r.of(i)
			i++
		}
		for k := range d.prog.keysOf(name) {
			if !slices.ContainsFunc(fes, func(fe *frontend) bool { return fe.key == k }) {
				if gone == nil {
					gone = map[feKey]bool{}
				}
				gone[k] = true
			}
		}
	}
	if len(gone) > 0 {
		for _, fe := range r.fes {
			delete(gone, fe.key)
		}
		for k := range gone {
			changes = append(changes, change{key: k})
		}
	}
	for i := range svcs {
		fes := r.of(i)
		for j, fe := range fes {
			if slices.ContainsFunc(fes[:j], func(g *frontend) bool { return g.key == fe.key }) {
				continue // a service's address listed twice: one frontend
			}
			if old := d.prog.frontends[fe.key]; full || old == nil || !old.fe.equal(fe) || old.fe.service != fe.service {
				changes = append(changes, change{key: fe.key, fe: fe})
			}
		}
	}
	return changes, nil
}

// renderParallelMin is the fewest services render splits among
// goroutines: below it, one renders them faster than several start.
const renderParallelMin = 4096

// rendered is the frontends of a list of services, service after
// service, in one slice (a slice each took 32 bytes and an allocation per
// service, 3 MB of garbage at 100,000).
type rendered struct {
	fes  []*frontend
	ends []int32 // the end in fes of each service's frontends
}

// of returns the frontends of service i.
func (r *rendered) of(i int) []*frontend {
	lo := int32(0)
	if i > 0 {
		lo = r.ends[i-1]
	}
	return r.fes[lo:r.ends[i]]
}

// render returns the frontends of each of svcs, in order. It fails with
// the error of the first service the dataplane cannot program. A large
// svcs is split among a few goroutines (services render independently,
// and only read svcs and node).
func (d *Dataplane) render(svcs []*dataplane.Service, node *dataplane.Node) (*rendered, error) {
	caps := d.Capabilities()
	par := max(1, min(runtime.GOMAXPROCS(0), maxWriters, len(svcs)/renderParallelMin))
	per := (len(svcs) + par - 1) / par
	parts := make([]rendered, par)
	errs := make([]error, par)
	// part renders svcs[lo:hi] into parts[p]; it stops at its first
	// failure, which is the first one of its range.
	part := func(p, lo, hi int) {
		n := 0
		for _, svc := range svcs[lo:hi] {
			n += len(svc.VIPs) * len(svc.Ports)
		}
		r := rendered{fes: make([]*frontend, 0, n), ends: make([]int32, 0, hi-lo)}
		for _, svc := range svcs[lo:hi] {
			var err error
			if err = caps.Check(svc); err == nil {
				r.fes, err = appendServiceFrontends(r.fes, svc, d.cfg.MaglevTableSize, node)
			}
			if err != nil {
				errs[p] = err
				return
			}
			r.ends = append(r.ends, int32(len(r.fes)))
		}
		parts[p] = r
	}
	if par == 1 {
		part(0, 0, len(svcs))
	} else {
		var wg sync.WaitGroup
		for i := range par {
			lo, hi := min(i*per, len(svcs)), min((i+1)*per, len(svcs))
			wg.Go(func() { part(i, lo, hi) })
		}
		wg.Wait()
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	if par == 1 {
		return &parts[0], nil
	}
	n := 0
	for _, r := range parts {
		n += len(r.fes)
	}
	out := &rendered{fes: make([]*frontend, 0, n), ends: make([]int32, 0, len(svcs))}
	for _, r := range parts {
		base := int32(len(out.fes))
		out.fes = append(out.fes, r.fes...)
		for _, e := range r.ends {
			out.ends = append(out.ends, base+e)
		}
	}
	return out, nil
}

// makeRoom fails, before anything is written, when changes would not fit
// the maps, unless ending the grace of draining frontends, and deleting
// the leaving ones outright (noDrain), makes them fit.
func (d *Dataplane) makeRoom(changes []change) error {
	d.prog.noDrain = false
	err := d.prog.checkCapacity(changes)
	if err == nil {
		return nil
	}
	// Nothing of this change was written, but the dataplane contract
	// (and the drain below, which deletes entries) wants the next
	// Apply to be a full one.
	d.needFull = true
	if len(d.prog.draining) == 0 && !hasRemovals(changes) {
		return err
	}
	// Room may be in draining frontends: end their flows' grace,
	// and delete the leaving ones outright.
	if _, derr := d.prog.drained(nil); derr != nil {
		return errors.Join(err, derr)
	}
	d.prog.noDrain = true
	if err := d.prog.checkCapacity(changes); err != nil {
		return err
	}
	d.log.Warn("maps near capacity: deleted frontends were removed without letting their flows drain")
	return nil
}

// attachOrRepair attaches the programs after the first successful apply.
// After a later full one it repairs, outside the all-or-nothing part (the
// maps hold the state now), vipd_config and the attachments: it attaches
// the programs again where they are missing and pins vipd's maps again
// where another map took their place, returning what it repaired. What
// cannot be attached stays drift (see repairAttachments); it never fails
// the Apply.
func (d *Dataplane) attachOrRepair(full bool) ([]dataplane.Drift, error) {
	if !d.attached {
		if err := d.attach(); err != nil {
			return nil, err
		}
		d.attached = true
		return nil, nil
	}
	if !full {
		return nil, nil
	}
	return append(d.repairConfig(), d.repairAttachments()...), nil
}

// logFullApply logs, at INFO, what a full apply changed in the maps and
// the attachments it repaired.
func (d *Dataplane) logFullApply(repaired []dataplane.Drift, start time.Time) {
	args := d.prog.changed.logArgs()
	if len(repaired) > 0 {
		links, pins := 0, 0
		details := make([]string, len(repaired))
		for i, r := range repaired {
			details[i] = r.Detail
			switch r.What {
			case driftMap:
				pins++
			case driftTCLink, driftCgroupLink:
				links++
			}
		}
		args = append(args, "links_reattached", links, "maps_repinned", pins, "repaired", details)
	}
	d.log.Info("full apply changed the dataplane", append(args, "elapsed", time.Since(start))...)
}

// hasRemovals reports whether changes remove a frontend.
func hasRemovals(changes []change) bool {
	for _, c := range changes {
		if c.fe == nil {
			return true
		}
	}
	return false
}

// attach puts the programs in place: tc on pod interfaces, socket hooks on
// the cgroup.
func (d *Dataplane) attach() error {
	if err := attachCgroup(d.cfg.CgroupPath, d.linkDir(), cgroupHooks(&d.objs.bpfPrograms)); err != nil {
		return err
	}
	if err := d.tc.start(); err != nil {
		return err
	}
	if err := d.ext.start(); err != nil {
		return err
	}
	d.log.Info("programs attached", "cgroup", d.cfg.CgroupPath, "interfaces", len(d.tc.interfaces()))
	return nil
}

// rollback rewrites the state of the last successful apply and prunes
// whatever a failed one added.
func (p *programmer) rollback() error {
	changes := make([]change, 0, len(p.frontends))
	for k, pr := range p.frontends {
		changes = append(changes, change{key: k, fe: pr.fe})
	}
	return p.apply(changes, true)
}

// destroyStuckSockets destroys node-local UDP sockets that the socket hooks
// connected to backends that have now left a frontend: such a socket would
// otherwise keep sending to the removed backend.
func (d *Dataplane) destroyStuckSockets(fe feKey, revNat uint32, gone []beKey) {
	goneSet := map[beKey]bool{}
	var dsts []netip.AddrPort
	for _, b := range gone {
		goneSet[b] = true
		dsts = append(dsts, netip.AddrPortFrom(b.addr, b.port))
	}
	cookies := map[uint64]bool{}
	err := forEach(d.objs.VipdSockRevnat, func(k bpfSockKey, v bpfSockVal) {
		if v.RevNatId == revNat && goneSet[beKey{addr: fromWords(k.Addr.W), port: fromBE16(k.Port)}] {
			cookies[k.Cookie] = true
		}
	})
	if err != nil {
		d.log.Warn("read socket translations", "error", err)
		return
	}
	if len(cookies) == 0 {
		return
	}
	n, err := sockdiag.DestroyUDP(d.cfg.NetNS, dsts, cookies)
	if err != nil {
		d.log.Warn("destroy UDP sockets stuck on removed backends", "frontend", fe.String(), "error", err)
		return
	}
	d.log.Debug("destroyed UDP sockets stuck on removed backends", "frontend", fe.String(), "sockets", n)
}

// Close stops vipd's goroutines, and a running WatchFlows, and closes its
// handles. Programs, links and maps stay in the kernel (pinned): traffic
// keeps flowing.
func (d *Dataplane) Close() error {
	d.watchMu.Lock()
	d.closing = true
	d.watchMu.Unlock()
	close(d.stopGC) // also ends a running WatchFlows
	d.tc.stop()
	d.ext.stop()
	d.wg.Wait()
	d.watchers.Wait()
	return d.objs.Close()
}

// Supported reports, with an error naming what is missing, whether the
// kernel can run this dataplane.
func Supported() error {
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("ebpf dataplane: %w", err)
	}
	spec, err := loadBpf()
	if err != nil {
		return fmt.Errorf("ebpf dataplane: %w", err)
	}
	// Loading one program exercises BPF, tc programs and the helpers the
	// packet path needs; a tiny map set keeps it cheap.
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
		switch m.Type {
		case ebpf.Array, ebpf.HashOfMaps, ebpf.SkStorage: // socket storage has no size (max_entries 0)
		case ebpf.RingBuf:
			m.MaxEntries = uint32(os.Getpagesize())
		default:
			m.MaxEntries = 1
		}
	}
	for name := range spec.Programs {
		if name != "vipd_from_pod" && name != "vipd_sock_connect4" {
			delete(spec.Programs, name)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("ebpf dataplane: loading BPF programs is not permitted (needs root or CAP_BPF+CAP_NET_ADMIN): %w", err)
		}
		return fmt.Errorf("ebpf dataplane: this kernel cannot load vipd's BPF programs: %w", err)
	}
	coll.Close()
	return nil
}

// Cleanup removes everything the dataplane put into the kernel for the
// namespace at netnsPath and the bpffs directory bpffs: tc programs (tcx
// links and clsact filters), the socket hooks' cgroup links, the pinned
// programs and the pinned maps. Traffic to VIPs stops being translated.
func Cleanup(log hclog.Logger, netnsPath, bpffs string) error {
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	links := filepath.Join(bpffs, "links")
	var errs []error
	if err := detachCgroup(links); err != nil {
		errs = append(errs, fmt.Errorf("detach socket hooks: %w", err))
	}
	if err := detachAll(netnsPath, links); err != nil {
		errs = append(errs, fmt.Errorf("detach tc programs: %w", err))
	}
	removePinnedMaps(bpffs)
	if err := removeProgramPins(bpffs); err != nil {
		errs = append(errs, fmt.Errorf("remove program pins: %w", err))
	}
	os.Remove(links)
	log.Info("removed the eBPF dataplane", "bpffs", bpffs)
	return errors.Join(errs...)
}
