package nodenet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/nsdo"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Defaults of a Watcher's timing.
const (
	// DefaultDebounce is how long a Watcher waits after a change for more
	// before it reads the node again: a burst of changes (an interface
	// coming up with its addresses and routes) costs one read.
	DefaultDebounce = 100 * time.Millisecond
	// DefaultResync is how often a Watcher reads the node again without
	// being told of a change.
	DefaultResync = 30 * time.Second
)

// maxDumpTries bounds the reads of an interrupted netlink dump (the kernel
// changed the list while it was being sent).
const maxDumpTries = 5

// Read reads the node once: the Node of cfg's namespace as it is now.
func Read(cfg Config) (dataplane.Node, error) {
	h, err := openHandle(cfg.NetNS)
	if err != nil {
		return dataplane.Node{}, err
	}
	defer h.Close()
	return read(cfg, h)
}

// openHandle opens a route netlink socket inside the namespace at path
// (the caller's own when empty). The socket stays in that namespace, and is
// used from any thread afterwards.
func openHandle(path string) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := nsdo.Do(path, func() error {
		// No target namespace: the socket is opened in the thread's own,
		// which nsdo has entered. (NewHandleAt with a handle would switch
		// namespaces itself, without nsdo's care for the thread.)
		var err error
		h, err = netlink.NewHandleAt(netns.None(), unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open netlink in network namespace %q: %w", path, err)
	}
	return h, nil
}

func read(cfg Config, h *netlink.Handle) (dataplane.Node, error) {
	var (
		nlinks []netlink.Link
		naddrs []netlink.Addr
		routes []netlink.Route
		err    error
	)
	for range maxDumpTries {
		nlinks, err = h.LinkList()
		if err == nil {
			naddrs, err = h.AddrList(nil, netlink.FAMILY_ALL)
		}
		if err == nil {
			routes, err = h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{}, 0)
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return dataplane.Node{}, fmt.Errorf("read the node's links, addresses and routes: %w", err)
	}
	links := make([]link, 0, len(nlinks))
	for _, l := range nlinks {
		a := l.Attrs()
		links = append(links, link{name: a.Name, index: a.Index, up: a.Flags&net.FlagUp != 0})
	}
	var addrs []addr
	for _, a := range naddrs {
		if ip, ok := usable(a); ok {
			addrs = append(addrs, addr{index: a.LinkIndex, ip: ip})
		}
	}
	return build(cfg, links, addrs, defaultRouteLinks(routes)), nil
}

// Watcher follows the node's network; see the package documentation.
type Watcher struct {
	log      hclog.Logger
	cfg      Config
	debounce time.Duration
	resync   time.Duration
}

// Option changes a Watcher's timing.
type Option func(*Watcher)

// WithDebounce sets how long the Watcher waits after a change for more
// before it reads the node (DefaultDebounce).
func WithDebounce(d time.Duration) Option { return func(w *Watcher) { w.debounce = d } }

// WithResync sets how often the Watcher reads the node without being told
// of a change (DefaultResync).
func WithResync(d time.Duration) Option { return func(w *Watcher) { w.resync = d } }

// New returns a Watcher of cfg's namespace. It watches nothing until Run.
func New(log hclog.Logger, cfg Config, opts ...Option) *Watcher {
	w := &Watcher{log: log, cfg: cfg, debounce: DefaultDebounce, resync: DefaultResync}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Read reads the node once; see the package-level Read.
func (w *Watcher) Read() (dataplane.Node, error) { return Read(w.cfg) }

// Run follows the node until ctx ends. It reads the node at once, and
// again at most the debounce time after the first of a burst of link,
// address or route changes, and every resync period, and calls emit with
// each Node that differs from the one before (Node.Equal); the one before
// the first is prev, the Node the caller already has (from Read). emit
// runs on Run's goroutine and may block: changes that come meanwhile are
// merged into the next read. A read or subscription that fails is logged
// and retried every second; Run returns only when ctx ends.
func (w *Watcher) Run(ctx context.Context, prev dataplane.Node, emit func(context.Context, dataplane.Node)) {
	kick := make(chan struct{}, 1)
	notify := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	var h *netlink.Handle
	var sub *subscription
	defer func() {
		if sub != nil {
			sub.close()
		}
		if h != nil {
			h.Close()
		}
	}()
	retry := time.NewTimer(0) // at once: open, subscribe and read
	defer retry.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	pending := false
	resync := time.NewTicker(w.resync)
	defer resync.Stop()
	last := prev
	check := func() {
		n, err := read(w.cfg, h)
		if err != nil {
			w.log.Warn("read the node's network; retrying", "error", err)
			retry.Reset(time.Second)
			return
		}
		if n.Equal(&last) {
			return
		}
		w.log.Info("node network changed", "nodeport_addresses", n.NodePortAddresses, "external_interfaces", n.ExternalInterfaces())
		last = n
		emit(ctx, n)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
			var err error
			if h == nil {
				h, err = openHandle(w.cfg.NetNS)
			}
			if err == nil && sub == nil {
				// Before the read: no change falls between the two.
				sub, err = w.subscribe(notify)
			}
			if err != nil {
				w.log.Warn("follow the node's network; retrying", "error", err)
				retry.Reset(time.Second)
				continue
			}
			check()
		case <-kick:
			if sub != nil && sub.ended() {
				// It broke (an overrun, say): subscribe again and read
				// everything, as changes may have been lost.
				w.log.Warn("netlink subscription ended; subscribing again")
				sub.close()
				sub = nil
				retry.Reset(w.debounce)
				continue
			}
			if !pending && h != nil {
				pending = true
				debounce.Reset(w.debounce)
			}
		case <-debounce.C:
			pending = false
			check()
		case <-resync.C:
			if h != nil {
				check()
			}
		}
	}
}

// subscription is one set of link, address and route subscriptions.
type subscription struct {
	stop chan struct{} // closed by close
	done chan struct{} // closed once all three have ended
	once sync.Once
}

// ended reports whether the subscriptions have ended.
func (s *subscription) ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// close ends the subscriptions and waits for them.
func (s *subscription) close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

// subscribe subscribes to link, address and route changes in the
// namespace, calling notify after each. When one of them breaks (a
// receive error, such as an overrun), all three end, and notify is called
// once more so that the caller notices (subscription.ended).
func (w *Watcher) subscribe(notify func()) (*subscription, error) {
	linkCh := make(chan netlink.LinkUpdate, 64)
	addrCh := make(chan netlink.AddrUpdate, 64)
	routeCh := make(chan netlink.RouteUpdate, 64)
	s := &subscription{stop: make(chan struct{}), done: make(chan struct{})}
	// The sockets close when sockDone closes, which also ends their
	// channels.
	sockDone := make(chan struct{})
	logErr := func(err error) {
		select {
		case <-sockDone: // closing: not an error
		default:
			w.log.Warn("netlink subscription", "error", err)
		}
	}
	var nlinks, naddrs int
	err := nsdo.Do(w.cfg.NetNS, func() error {
		// No Namespace option: the sockets are opened in the thread's
		// namespace, which nsdo has entered.
		if err := netlink.LinkSubscribeWithOptions(linkCh, sockDone, netlink.LinkSubscribeOptions{ErrorCallback: logErr}); err != nil {
			return fmt.Errorf("links: %w", err)
		}
		nlinks++
		if err := netlink.AddrSubscribeWithOptions(addrCh, sockDone, netlink.AddrSubscribeOptions{ErrorCallback: logErr}); err != nil {
			return fmt.Errorf("addresses: %w", err)
		}
		naddrs++
		if err := netlink.RouteSubscribeWithOptions(routeCh, sockDone, netlink.RouteSubscribeOptions{ErrorCallback: logErr}); err != nil {
			return fmt.Errorf("routes: %w", err)
		}
		return nil
	})
	if err != nil {
		close(sockDone)
		// Wait for those that started to end.
		if nlinks > 0 {
			for range linkCh {
			}
		}
		if naddrs > 0 {
			for range addrCh {
			}
		}
		return nil, fmt.Errorf("subscribe to changes: %w", err)
	}
	go func() {
		defer close(s.done)
		defer notify()
		var once sync.Once
		stopSockets := func() { once.Do(func() { close(sockDone) }) }
		defer stopSockets()
		stop := s.stop
		for linkCh != nil || addrCh != nil || routeCh != nil {
			select {
			case <-stop:
				stopSockets()
				stop = nil
			case _, ok := <-linkCh:
				if !ok {
					linkCh = nil
					stopSockets()
					continue
				}
				notify()
			case _, ok := <-addrCh:
				if !ok {
					addrCh = nil
					stopSockets()
					continue
				}
				notify()
			case _, ok := <-routeCh:
				if !ok {
					routeCh = nil
					stopSockets()
					continue
				}
				notify()
			}
		}
	}()
	return s, nil
}
