package ebpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/nsdo"
)

// MapSizes are the capacities of the BPF maps. The defaults fit 100,000
// services × 10 backends (1.1M service entries, 1M members, 1M backends).
type MapSizes struct {
	// LB sizes the service map (a master entry per VIP:port plus one slot
	// per eligible backend); the member map gets 3/5 of it, the
	// reverse-NAT and Maglev maps (one entry per VIP:port) 1/16.
	LB uint32
	// Backends sizes the backend map: distinct backend address:port pairs.
	Backends uint32
	// Conntrack sizes the conntrack map (LRU; two entries per flow); the
	// map of the backends' TIME_WAIT behind SNAT (vipd_snat_tw, LRU, one
	// record per flow closed in the last 65 s) gets half of it.
	Conntrack uint32
	// Affinity sizes the session-affinity map (LRU).
	Affinity uint32
	// Sockets sizes the LRU maps of node-local UDP sockets' translations
	// (vipd_sock_revnat, vipd_sock_udp); TCP sockets keep theirs in socket
	// storage (vipd_sock_conn), which needs no size.
	Sockets uint32
	// Events is the size in bytes of the flow event ring buffer: a power
	// of two, at least the page size. An event takes 128 bytes, so the
	// default holds 65,536 events that the reader has not caught up with;
	// the events that find it full are counted and reported lost.
	Events uint32
}

// DefaultMapSizes are the sizes vipd uses unless told otherwise. Hash maps
// are not preallocated, but the kernel allocates their bucket arrays (16
// bytes per power-of-two bucket) up front, so sizes stay just above 100,000
// services × 10 backends.
var DefaultMapSizes = MapSizes{
	LB:        2_000_000,
	Backends:  1_200_000,
	Conntrack: 524_288,
	Affinity:  131_072,
	Sockets:   262_144,
	Events:    8 << 20,
}

const (
	bpffsMagic    = 0xcafe4a11
	soNetnsCookie = 71 // SO_NETNS_COOKIE, Linux 5.14
)

// ensureBPFFS makes dir a directory on a bpffs, mounting one there when it
// is on another file system. It reports whether it mounted.
//
// The bpffs must outlive vipd: its pins hold the maps and links that keep
// traffic flowing while vipd is down. So when vipd runs in a mount
// namespace other than init's (ns names the two), as `ip netns exec` or a
// unit with private mounts gives it, ensureBPFFS refuses to mount one
// there, and refuses a bpffs that init's namespace has no mount of (one
// mounted in vipd's namespace alone): either would vanish, with every pin,
// when vipd exits. When it cannot tell (init's namespace is unreadable, as
// in some containers), it goes on, with a warning if it mounts.
//
// In a private mount namespace a failure to create or stat dir carries the
// same remedy: under `ip netns exec` /sys is a fresh sysfs, so the default
// /sys/fs/bpf/vipd cannot even be created.
func ensureBPFFS(log hclog.Logger, dir string, ns mountNSFiles) (bool, error) {
	private, privErr := ns.private()
	hint := func(err error) error {
		if !private {
			return err
		}
		return fmt.Errorf("%w; vipd runs in a mount namespace of its own (not init's, as under `ip netns exec`, "+
			"which replaces /sys with a fresh sysfs). %s", err, bpffsFix)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, hint(fmt.Errorf("create bpffs directory %s: %w", dir, err))
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, hint(fmt.Errorf("statfs %s: %w", dir, err))
	}
	if uint32(st.Type) == bpffsMagic {
		if !private {
			return false, nil
		}
		if shared, err := ns.initHasBPFFS(dir); err == nil && !shared {
			return false, fmt.Errorf("the bpffs at %s is mounted only in vipd's own mount namespace (not init's, "+
				"as under `ip netns exec`): it would vanish with every pin when vipd exits, and traffic to VIPs "+
				"would stop on a crash. %s", dir, bpffsFix)
		}
		return false, nil
	}
	if private {
		return false, fmt.Errorf("%s is not on a bpffs, and vipd runs in a mount namespace of its own (not init's, "+
			"as under `ip netns exec`): a bpffs that vipd mounted there would vanish with every pin when vipd exits, "+
			"and traffic to VIPs would stop on a crash. %s", dir, bpffsFix)
	}
	if privErr != nil {
		log.Warn("cannot tell whether vipd runs in the host's mount namespace: if it does not, the bpffs it mounts, "+
			"and the pins in it, vanish when vipd exits", "bpffs", dir, "error", privErr)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return false, fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return true, nil
}

// bpffsFix says how to give vipd a bpffs that outlives it.
const bpffsFix = "Mount a bpffs in the host's mount namespace before starting vipd, outside /sys " +
	"(which `ip netns exec` replaces), e.g. `mkdir -p /run/vipd/bpffs && mount -t bpf bpf /run/vipd/bpffs`, " +
	"and pass --bpffs /run/vipd/bpffs; or run vipd in the host's mount namespace with --netns /run/netns/NAME " +
	"instead of `ip netns exec NAME`"

// mountNSFiles name vipd's mount namespace and init's, and init's
// mountinfo.
type mountNSFiles struct{ self, init, initMountinfo string }

// hostMountNS compares the calling thread's mount namespace with init's.
var hostMountNS = mountNSFiles{self: "/proc/thread-self/ns/mnt", init: "/proc/1/ns/mnt", initMountinfo: "/proc/1/mountinfo"}

// private reports whether ns.self names another namespace than ns.init.
func (ns mountNSFiles) private() (bool, error) {
	var self, init unix.Stat_t
	if err := unix.Stat(ns.self, &self); err != nil {
		return false, fmt.Errorf("stat %s: %w", ns.self, err)
	}
	if err := unix.Stat(ns.init, &init); err != nil {
		return false, fmt.Errorf("stat %s: %w", ns.init, err)
	}
	return self.Dev != init.Dev || self.Ino != init.Ino, nil
}

// initHasBPFFS reports whether init's mount namespace has a mount of the
// bpffs that dir is on: every mount of a bpffs instance shares its device
// number, and the instance (with its pins) lives while any mount of it does.
func (ns mountNSFiles) initHasBPFFS(dir string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	b, err := os.ReadFile(ns.initMountinfo)
	if err != nil {
		return false, err
	}
	// Fields: mount ID, parent ID, major:minor, root, mount point, ...
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == dev && strings.Contains(line, " - bpf ") {
			return true, nil
		}
	}
	return false, nil
}

// UnmountBPFFS detaches the bpffs mounted at dir, if any (each of them,
// should several be stacked there), leaving dir a directory of the file
// system below; a dir that does not exist is fine. It is the inverse of
// the mount New makes at Config.BPFFS, for tests and tools that gave vipd a
// private directory and must leave nothing behind.
func UnmountBPFFS(dir string) error {
	for range 10 {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("statfs %s: %w", dir, err)
		}
		if uint32(st.Type) != bpffsMagic {
			return nil
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount bpffs %s: %w", dir, err)
		}
	}
	return fmt.Errorf("unmount bpffs %s: still a bpffs after 10 unmounts", dir)
}

// netnsCookie returns the cookie of the network namespace at path.
func netnsCookie(path string) (uint64, error) {
	var cookie uint64
	err := nsdo.Do(path, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
		if err != nil {
			return fmt.Errorf("SO_NETNS_COOKIE (Linux 5.14 or later): %w", err)
		}
		cookie = v
		return nil
	})
	return cookie, err
}

// loadObjects loads the BPF programs and the maps pinned in dir, creating
// and pinning the maps that do not exist yet. Pinned maps of another layout
// version, or whose sizes no longer match the configuration, are replaced
// (and the log says so: established flows through VIPs may then reset).
// The programs pinned in dir by an earlier start are reused when they are
// exactly what a load would give over these maps (loadOrReusePrograms);
// else fresh ones are loaded and pinned in their place. spec is
// sizedSpec's.
func loadObjects(log hclog.Logger, dir string, spec *ebpf.CollectionSpec) (*bpfObjects, *ebpf.MapSpec, error) {
	inner := spec.Maps["vipd_maglev"].InnerMap.Copy()

	if v, ok := pinnedLayout(dir); ok && v != layoutVersion {
		log.Warn("pinned maps have another layout version: replacing them; established flows through VIPs may reset",
			"pinned", v, "ours", layoutVersion)
		removePinnedMaps(dir)
	}
	removeResizedMaps(log, dir, spec)
	removeUnfilteredConntrack(log, dir)
	// The filter of a pinned services map is in sync with it (its bits
	// are set before the entries are written, and never cleared), unless
	// the filter itself is created now (its pin is missing).
	filterPinned := pinExists(filepath.Join(dir, "vipd_svc_addrs"))
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
	var objs bpfObjects
	err := spec.LoadAndAssign(&objs.bpfMaps, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		log.Warn("pinned maps do not match the configured sizes: replacing them; established flows through VIPs may reset",
			"error", err)
		removePinnedMaps(dir)
		filterPinned = false
		err = spec.LoadAndAssign(&objs.bpfMaps, opts)
	}
	if err != nil {
		return nil, nil, explainLoadError(fmt.Errorf("load BPF maps: %w", err))
	}
	progs, err := loadOrReusePrograms(log, dir, spec, &objs.bpfMaps)
	if err != nil {
		objs.bpfMaps.Close()
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, nil, explainLoadError(fmt.Errorf("load BPF programs: %+v", ve))
		}
		return nil, nil, explainLoadError(fmt.Errorf("load BPF programs: %w", err))
	}
	objs.bpfPrograms = *progs
	if filterPinned {
		return &objs, inner, nil
	}
	// The frontend filter must cover every frontend of a pinned services
	// map also when the filter itself was just created: a frontend
	// without its bit would be dead.
	var fes []bpfSvcKey
	err = forEach(objs.VipdServices, func(k bpfSvcKey, _ bpfSvcVal) {
		if k.Slot == 0 {
			fes = append(fes, k)
		}
	})
	if err == nil {
		err = markFrontends(objs.VipdSvcAddrs, fes)
	}
	if err != nil {
		objs.Close()
		return nil, nil, fmt.Errorf("fill the frontend filter from the pinned services: %w", err)
	}
	return &objs, inner, nil
}

// explainLoadError returns Supported's error, which names what the kernel
// lacks, in place of err when there is one.
func explainLoadError(err error) error {
	if serr := Supported(); serr != nil {
		return fmt.Errorf("%w (%v)", serr, err)
	}
	return err
}

// pinExists reports whether a pin (or any file) exists at path.
func pinExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// sizedSpec returns the spec of vipd's objects with the maps sized as
// sizes says.
func sizedSpec(sizes MapSizes) (*ebpf.CollectionSpec, error) {
	spec, err := loadBpf()
	if err != nil {
		return nil, fmt.Errorf("load BPF spec: %w", err)
	}
	for name, size := range map[string]uint32{
		"vipd_services":    sizes.LB,
		"vipd_members":     max(sizes.LB/5*3, 1),
		"vipd_revnat":      max(sizes.LB/16, 1),
		"vipd_maglev":      max(sizes.LB/16, 1),
		"vipd_backends":    sizes.Backends,
		"vipd_ct":          sizes.Conntrack,
		"vipd_snat_tw":     max(sizes.Conntrack/2, 1),
		"vipd_affinity":    sizes.Affinity,
		"vipd_sock_revnat": sizes.Sockets,
		"vipd_sock_udp":    sizes.Sockets,
		"vipd_events":      sizes.Events,
	} {
		if size == 0 {
			return nil, fmt.Errorf("map %s: size 0", name)
		}
		spec.Maps[name].MaxEntries = size
	}
	return spec, nil
}

// removeResizedMaps unpins the maps whose size (or shape) the configuration
// changed, and only those: resizing the event ring does not cost the
// conntrack entries of established flows. A resized map starts empty; the
// first (full) apply refills the service maps.
func removeResizedMaps(log hclog.Logger, dir string, spec *ebpf.CollectionSpec) {
	for name, ms := range spec.Maps {
		pin := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(pin, nil)
		if err != nil {
			continue
		}
		same := m.Type() == ms.Type && m.KeySize() == ms.KeySize && m.ValueSize() == ms.ValueSize &&
			m.MaxEntries() == ms.MaxEntries
		m.Close()
		if !same {
			log.Warn("pinned map differs from the configuration: replacing it, empty", "map", name,
				"max_entries", ms.MaxEntries)
			os.Remove(pin)
		}
	}
}

// removeUnfilteredConntrack unpins vipd_ct when vipd_ct_srcs, the filter
// that must cover the source of each of its reply entries, is not pinned
// beside it: the programs would take those flows' replies for untracked
// packets. The flows start afresh, as with a layout change.
func removeUnfilteredConntrack(log hclog.Logger, dir string) {
	ct := filepath.Join(dir, "vipd_ct")
	if _, err := os.Stat(ct); err != nil {
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "vipd_ct_srcs")); err == nil {
		return
	}
	log.Warn("pinned conntrack table has no source filter: replacing it; established flows through VIPs may reset")
	os.Remove(ct)
}

// pinnedLayout reads the layout version of the maps pinned in dir.
func pinnedLayout(dir string) (uint32, bool) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "vipd_config"), nil)
	if err != nil {
		return 0, false
	}
	defer m.Close()
	// Read as bytes: the config of another layout may have another size,
	// but its layout version is at offset 8 in every layout.
	buf := make([]byte, m.ValueSize())
	if err := m.Lookup(uint32(0), buf); err != nil || len(buf) < 12 {
		return 0, false
	}
	v := binary.NativeEndian.Uint32(buf[8:])
	return v, v != 0
}

// removePinnedMaps unpins every vipd map in dir (links stay).
func removePinnedMaps(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "vipd_") {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// checkEventsSize fails unless size is a size the kernel takes for a ring
// buffer.
func checkEventsSize(size uint32) error {
	if size < uint32(os.Getpagesize()) || size&(size-1) != 0 {
		return fmt.Errorf("flow event ring size %d: want a power of two of at least the page size (%d)", size, os.Getpagesize())
	}
	return nil
}

// configFor is what the programs need to know about this node: the entry
// of vipd_config.
func configFor(hostNetnsCookie uint64, ct ConntrackTimeouts, snat PortRange) bpfConfig {
	return bpfConfig{
		SnatPortMin:      snat.Min,
		SnatPortMax:      snat.Max,
		HostNetnsCookie:  hostNetnsCookie,
		LayoutVersion:    layoutVersion,
		CtTcpSyn:         seconds(ct.TCPSyn),
		CtTcpEstablished: seconds(ct.TCPEstablished),
		CtTcpClose:       seconds(ct.TCPClose),
		CtOther:          seconds(ct.Other),
	}
}

// writeConfig stores cfg in vipd_config.
func writeConfig(m *bpfMaps, cfg bpfConfig) error {
	if err := m.VipdConfig.Put(uint32(0), &cfg); err != nil {
		return fmt.Errorf("write config map: %w", err)
	}
	return nil
}

// seconds rounds d up to whole seconds for the programs; 0 (the programs'
// default) stays 0.
func seconds(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min(math.Ceil(d.Seconds()), math.MaxUint32))
}
