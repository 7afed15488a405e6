package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipd/vipd/internal/nsdo"
)

// DefaultPodInterfaces are the host-side pod interfaces the tc programs go
// on: veth pairs as most CNIs name them, Cilium's lxc and Calico's cali.
var DefaultPodInterfaces = []string{"veth*", "lxc*", "cali*"}

// tcAttacher keeps vipd_from_pod on the ingress and vipd_to_pod on the
// egress of every pod interface of one namespace, including interfaces
// that appear later (a netlink link subscription).
//
// It uses tcx links where the kernel has them (Linux 6.6), pinned under
// linkDir so that they outlive vipd, and clsact filters elsewhere (which
// outlive vipd by themselves).
type tcAttacher struct {
	log      hclog.Logger
	netns    string
	patterns []string
	linkDir  string
	ingress  *ebpf.Program
	egress   *ebpf.Program
	// pinPrefix starts the names of the tcx link pins: "tcx" on pod
	// interfaces, "ext" on external interfaces. progNames name the
	// ingress and egress programs in drift details.
	pinPrefix string
	progNames [2]string
	// what the interfaces are, for logs: "pod" or "external".
	what string

	patMu sync.Mutex // guards patterns, which setInterfaces changes

	mu       sync.Mutex
	attached map[int]string // ifindex -> name
	// failed are the pod interfaces whose last attach failed, and
	// unprocessed those that check found matching but neither attached nor
	// failed (the watcher has not got to them yet), with when it first did.
	failed      map[int]string
	unprocessed map[int]time.Time
	useTCX      bool
	mode        string // TCAttachAuto, TCAttachTCX or TCAttachClsact
	watching    bool   // the link subscription runs (start may be retried)
	done        chan struct{}
	wg          sync.WaitGroup
}

// How the tc programs are attached (Config.TCAttach).
const (
	// TCAttachAuto uses tcx links where the kernel has them, else clsact.
	TCAttachAuto = "auto"
	// TCAttachTCX uses tcx links only.
	TCAttachTCX = "tcx"
	// TCAttachClsact uses clsact filters only.
	TCAttachClsact = "clsact"
)

func newTCAttacher(log hclog.Logger, netnsPath string, patterns []string, linkDir, mode string, ingress, egress *ebpf.Program) *tcAttacher {
	return &tcAttacher{
		log: log, netns: netnsPath, patterns: patterns, linkDir: linkDir,
		ingress: ingress, egress: egress, mode: mode,
		pinPrefix: "tcx", progNames: [2]string{"vipd_from_pod", "vipd_to_pod"}, what: "pod",
		attached: map[int]string{}, failed: map[int]string{}, unprocessed: map[int]time.Time{},
		useTCX: mode != TCAttachClsact, done: make(chan struct{}),
	}
}

// newExtAttacher is the attacher of vipd_from_ext and vipd_to_ext on the
// node's external interfaces, named exactly (setInterfaces).
func newExtAttacher(log hclog.Logger, netnsPath, linkDir, mode string, ingress, egress *ebpf.Program) *tcAttacher {
	a := newTCAttacher(log, netnsPath, nil, linkDir, mode, ingress, egress)
	a.pinPrefix, a.progNames, a.what = "ext", [2]string{"vipd_from_ext", "vipd_to_ext"}, "external"
	return a
}

// matches reports whether an interface name is one of the attacher's
// (a pod interface, or an external one). The caller holds a.mu, or is the
// only user of a.patterns.
func (a *tcAttacher) matches(name string) bool {
	a.patMu.Lock()
	defer a.patMu.Unlock()
	for _, p := range a.patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

func (a *tcAttacher) pinPath(ifindex int, dir string) string {
	return filepath.Join(a.linkDir, fmt.Sprintf("%s_%d_%s", a.pinPrefix, ifindex, dir))
}

// start attaches to every existing pod interface, drops pinned links of
// interfaces that are gone, and follows link changes until stop. It fails
// only when it cannot follow or list the interfaces: an interface it
// cannot attach to is logged and left to DetectDrift and its repair, so
// that one odd pod interface does not keep the whole dataplane detached.
func (a *tcAttacher) start() error {
	if err := os.MkdirAll(a.linkDir, 0o700); err != nil {
		return fmt.Errorf("create link pin directory: %w", err)
	}
	// Subscribe first, so that an interface created while the existing ones
	// are listed is not missed (attaching twice is harmless).
	if err := a.watch(); err != nil {
		return err
	}
	var links []netlink.Link
	if err := nsdo.Do(a.netns, func() (err error) {
		links, err = netlink.LinkList()
		return err
	}); err != nil {
		return fmt.Errorf("list interfaces: %w", err)
	}
	present := map[int]bool{}
	for _, l := range links {
		present[l.Attrs().Index] = true
		if a.matches(l.Attrs().Name) {
			err := a.attach(l.Attrs().Index, l.Attrs().Name)
			if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
				// A pod going away while vipd starts: not an error.
				a.log.Debug("interface gone before attaching", "interface", l.Attrs().Name)
				continue
			}
			if err != nil {
				a.log.Warn("cannot attach to a pod interface: its pod's traffic to VIPs is not load-balanced; "+
					"the drift check reports it and retries", "interface", l.Attrs().Name, "error", err)
			}
		}
	}
	a.dropStalePins(present)
	if a.pinPrefix == "ext" {
		a.detachUnnamed()
	}
	return nil
}

// detachUnnamed detaches the external programs an earlier vipd left on
// interfaces that are not external any more (the Node changed while vipd
// was down): its pinned tcx links, and its clsact filters, told from the
// pod programs' (same name and priority) by their programs' names.
func (a *tcAttacher) detachUnnamed() {
	ours := func(idx int) bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		_, attached := a.attached[idx]
		_, failed := a.failed[idx]
		return attached || failed
	}
	entries, _ := os.ReadDir(a.linkDir)
	for _, e := range entries {
		var idx int
		var dir string
		if _, err := fmt.Sscanf(strings.Replace(e.Name(), "_", " ", -1), a.pinPrefix+" %d %s", &idx, &dir); err != nil {
			continue
		}
		if !ours(idx) {
			unpinLink(filepath.Join(a.linkDir, e.Name()))
		}
	}
	err := nsdo.Do(a.netns, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if ours(l.Attrs().Index) {
				continue
			}
			if err := removeClsactFiltersOf(l, a.progNames[:]); err != nil {
				a.log.Warn("cannot remove the external programs an earlier vipd left on an interface that is not external now",
					"interface", l.Attrs().Name, "error", err)
			}
		}
		return nil
	})
	if err != nil {
		a.log.Warn("cannot list interfaces for the external programs an earlier vipd left", "error", err)
	}
}

// removeClsactFiltersOf deletes vipd's clsact filters whose program is
// named one of progs from l, in the current namespace.
func removeClsactFiltersOf(l netlink.Link, progs []string) error {
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		filters, err := netlink.FilterList(l, parent)
		if err != nil {
			continue // no clsact qdisc
		}
		for _, f := range filters {
			bf, ok := f.(*netlink.BpfFilter)
			if !ok || bf.Name != filterName || bf.Id == 0 {
				continue
			}
			p, err := ebpf.NewProgramFromID(ebpf.ProgramID(bf.Id))
			if err != nil {
				continue // gone meanwhile
			}
			info, err := p.Info()
			p.Close()
			if err != nil || !slices.Contains(progs, info.Name) {
				continue
			}
			if err := netlink.FilterDel(f); err != nil {
				return fmt.Errorf("delete clsact filter on %s: %w", l.Attrs().Name, err)
			}
		}
	}
	return nil
}

// dropStalePins unpins tcx links of interfaces that no longer exist.
func (a *tcAttacher) dropStalePins(present map[int]bool) {
	entries, _ := os.ReadDir(a.linkDir)
	for _, e := range entries {
		var idx int
		var dir string
		name := strings.Replace(e.Name(), "_", " ", -1)
		if _, err := fmt.Sscanf(name, a.pinPrefix+" %d %s", &idx, &dir); err != nil {
			continue
		}
		if !present[idx] {
			os.Remove(filepath.Join(a.linkDir, e.Name()))
		}
	}
}

// attach puts both programs on one interface, replacing the programs of
// an earlier vipd in place (atomically) when it finds its pinned links.
func (a *tcAttacher) attach(ifindex int, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	err := nsdo.Do(a.netns, func() error {
		if a.useTCX {
			err := a.attachTCX(ifindex)
			if err == nil {
				// Switched from clsact: the programs must not run twice.
				return removeClsactFilters(ifindex)
			}
			if !errors.Is(err, ebpf.ErrNotSupported) || a.mode == TCAttachTCX {
				return err
			}
			a.log.Info("tcx is not supported by this kernel: using clsact filters")
			a.useTCX = false
		}
		if err := a.attachClsact(ifindex); err != nil {
			return err
		}
		// Switched from tcx: drop its links.
		for _, d := range []string{"ingress", "egress"} {
			unpinLink(a.pinPath(ifindex, d))
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENOENT) {
			a.failed[ifindex] = name
		}
		return fmt.Errorf("attach to %s: %w", name, err)
	}
	delete(a.failed, ifindex)
	if _, ok := a.attached[ifindex]; !ok {
		a.log.Debug("attached", "interface", name, "ifindex", ifindex)
	}
	a.attached[ifindex] = name
	return nil
}

func (a *tcAttacher) attachTCX(ifindex int) error {
	for _, d := range []struct {
		dir  string
		typ  ebpf.AttachType
		prog *ebpf.Program
	}{{"ingress", ebpf.AttachTCXIngress, a.ingress}, {"egress", ebpf.AttachTCXEgress, a.egress}} {
		pin := a.pinPath(ifindex, d.dir)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			err = l.Update(d.prog)
			l.Close()
			if err == nil {
				continue
			}
			// Defunct (its interface went away): replace it.
			os.Remove(pin)
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: d.prog, Attach: d.typ, Anchor: link.Head()})
		if err != nil {
			return err
		}
		err = l.Pin(pin)
		l.Close()
		if err != nil {
			return fmt.Errorf("pin tcx link: %w", err)
		}
	}
	return nil
}

// setInterfaces makes names the attacher's interfaces. Once started, it
// detaches from the interfaces no longer named and attaches to the new
// ones that exist; an interface it cannot attach to is logged and left to
// DetectDrift and its repair, as in start.
func (a *tcAttacher) setInterfaces(names []string, started bool) error {
	a.patMu.Lock()
	a.patterns = slices.Clone(names)
	a.patMu.Unlock()
	if !started {
		return nil
	}
	a.mu.Lock()
	gone := map[int]string{}
	for _, m := range []map[int]string{a.attached, a.failed} {
		for idx, name := range m {
			if !a.matches(name) {
				gone[idx] = name
			}
		}
	}
	a.mu.Unlock()
	var errs []error
	for idx, name := range gone {
		if err := a.detach(idx, name); err != nil {
			errs = append(errs, err)
		}
	}
	var links []netlink.Link
	if err := nsdo.Do(a.netns, func() (err error) {
		links, err = netlink.LinkList()
		return err
	}); err != nil {
		return errors.Join(append(errs, fmt.Errorf("list interfaces: %w", err))...)
	}
	for _, l := range links {
		a.mu.Lock()
		_, have := a.attached[l.Attrs().Index]
		a.mu.Unlock()
		if have || !a.matches(l.Attrs().Name) {
			continue
		}
		if err := a.attach(l.Attrs().Index, l.Attrs().Name); err != nil {
			a.log.Warn("cannot attach to an "+a.what+" interface; the drift check reports it and retries",
				"interface", l.Attrs().Name, "error", err)
		}
	}
	return errors.Join(errs...)
}

// detach removes the attacher's programs from one interface.
func (a *tcAttacher) detach(ifindex int, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.attached, ifindex)
	delete(a.failed, ifindex)
	for _, d := range []string{"ingress", "egress"} {
		unpinLink(a.pinPath(ifindex, d))
	}
	err := nsdo.Do(a.netns, func() error { return removeClsactFilters(ifindex) })
	if err != nil && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENOENT) {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return fmt.Errorf("detach from %s: %w", name, err)
		}
	}
	a.log.Debug("detached", "interface", name, "ifindex", ifindex)
	return nil
}

// unpinLink detaches the link pinned at pin, at once (dropping the last
// reference would also detach it, but only after an RCU grace period), and
// removes the pin.
func unpinLink(pin string) error {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		l.Detach()
		l.Close()
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// clsact filters carry this name so that vipd finds (and replaces) its own,
// at a priority and handle of their own, so that replacing one never
// touches another tool's filter (CNIs commonly use priority 1, handle 1).
const (
	filterName     = "vipd"
	filterPriority = 0x7d1
	filterHandle   = 0x7d1
)

func (a *tcAttacher) attachClsact(ifindex int) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	for _, d := range []struct {
		parent uint32
		prog   *ebpf.Program
	}{{netlink.HANDLE_MIN_INGRESS, a.ingress}, {netlink.HANDLE_MIN_EGRESS, a.egress}} {
		f := &netlink.BpfFilter{
			FilterAttrs:  netlink.FilterAttrs{LinkIndex: ifindex, Parent: d.parent, Handle: filterHandle, Protocol: unix.ETH_P_ALL, Priority: filterPriority},
			Fd:           d.prog.FD(),
			Name:         filterName,
			DirectAction: true,
		}
		if err := netlink.FilterReplace(f); err != nil {
			return fmt.Errorf("add bpf filter: %w", err)
		}
	}
	return nil
}

// watch follows link changes in the namespace. If the subscription breaks
// (a netlink receive error, such as an overrun), it subscribes again, listing
// the existing interfaces, so that no new pod interface is missed.
func (a *tcAttacher) watch() error {
	a.mu.Lock()
	running := a.watching
	a.watching = true
	a.mu.Unlock()
	if running {
		return nil
	}
	var h netns.NsHandle = -1
	if a.netns != "" {
		var err error
		if h, err = netns.GetFromPath(a.netns); err != nil {
			a.mu.Lock()
			a.watching = false
			a.mu.Unlock()
			return fmt.Errorf("open network namespace %s: %w", a.netns, err)
		}
	}
	subscribe := func(listExisting bool) (chan netlink.LinkUpdate, error) {
		ch := make(chan netlink.LinkUpdate, 256)
		opts := netlink.LinkSubscribeOptions{
			ListExisting: listExisting,
			ErrorCallback: func(err error) {
				select {
				case <-a.done: // stopping: the subscription's socket is closing
				default:
					a.log.Warn("link subscription", "error", err)
				}
			},
		}
		if h >= 0 {
			opts.Namespace = &h
		}
		if err := netlink.LinkSubscribeWithOptions(ch, a.done, opts); err != nil {
			return nil, fmt.Errorf("subscribe to link changes: %w", err)
		}
		return ch, nil
	}
	ch, err := subscribe(false)
	if err != nil {
		if h >= 0 {
			h.Close()
		}
		a.mu.Lock()
		a.watching = false
		a.mu.Unlock()
		return err
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if h >= 0 {
			defer h.Close()
		}
		for {
			for u := range ch {
				a.handle(u)
			}
			// The subscription ended: vipd is stopping, or it broke.
			for {
				select {
				case <-a.done:
					return
				case <-time.After(time.Second):
				}
				var err error
				if ch, err = subscribe(true); err == nil {
					break
				}
				a.log.Warn("resubscribe to link changes", "error", err)
			}
		}
	}()
	return nil
}

// handle attaches to a new pod interface and forgets a removed one.
func (a *tcAttacher) handle(u netlink.LinkUpdate) {
	attrs := u.Attrs()
	switch u.Header.Type {
	case unix.RTM_NEWLINK:
		a.mu.Lock()
		_, have := a.attached[attrs.Index]
		a.mu.Unlock()
		if !have && a.matches(attrs.Name) {
			if err := a.attach(attrs.Index, attrs.Name); err != nil {
				a.log.Error("attach to a new "+a.what+" interface", "interface", attrs.Name, "error", err)
			}
		}
	case unix.RTM_DELLINK:
		a.mu.Lock()
		delete(a.attached, attrs.Index)
		delete(a.failed, attrs.Index)
		a.mu.Unlock()
		for _, d := range []string{"ingress", "egress"} {
			os.Remove(a.pinPath(attrs.Index, d))
		}
	}
}

// stop ends the link subscription. The programs stay attached.
func (a *tcAttacher) stop() {
	select {
	case <-a.done:
	default:
		close(a.done)
	}
	a.wg.Wait()
}

// interfaces returns the names of the interfaces the programs are on.
func (a *tcAttacher) interfaces() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, n := range a.attached {
		out = append(out, n)
	}
	return out
}

// detachAll removes vipd's tc programs from every interface of the
// namespace: pinned tcx links in linkDir and clsact filters named vipd.
func detachAll(netnsPath, linkDir string) error {
	entries, _ := os.ReadDir(linkDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "tcx_") || strings.HasPrefix(e.Name(), "ext_") {
			unpinLink(filepath.Join(linkDir, e.Name()))
		}
	}
	return nsdo.Do(netnsPath, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if err := removeClsactFilters(l.Attrs().Index); err != nil {
				return err
			}
		}
		return nil
	})
}

// removeClsactFilters deletes vipd's clsact filters from one interface of
// the current namespace.
func removeClsactFilters(ifindex int) error {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("interface %d: %w", ifindex, err)
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		filters, err := netlink.FilterList(l, parent)
		if err != nil {
			continue // no clsact qdisc
		}
		for _, f := range filters {
			if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == filterName {
				if err := netlink.FilterDel(f); err != nil {
					return fmt.Errorf("delete clsact filter on %s: %w", l.Attrs().Name, err)
				}
			}
		}
	}
	return nil
}
