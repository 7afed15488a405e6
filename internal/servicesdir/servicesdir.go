package servicesdir

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Defaults of Config.
const (
	// DefaultRescanPeriod is how often the directory is read again even
	// without an event, which catches what fsnotify cannot see (network
	// file systems, a lost inotify queue).
	DefaultRescanPeriod = 10 * time.Second
	// DefaultDebounce is how long events are merged before a scan: long
	// enough for a writer's truncate and write to arrive together, short
	// enough that a change is applied well within a second.
	DefaultDebounce = 100 * time.Millisecond
)

// WarningCheck starts the Check of every GetStatus warning of the
// directory: "services-dir/web.yaml" for a file, "services-dir" for the
// directory itself.
const WarningCheck = "services-dir"

// API is the part of vipd's API the directory is applied through; the
// daemon passes its *server.API, so that a file's services take the path
// of every SyncServices.
type API interface {
	SyncServices(context.Context, *vipdv1.SyncServicesRequest) (*vipdv1.SyncServicesResponse, error)
	ListServices(context.Context, *vipdv1.ListServicesRequest) (*vipdv1.ListServicesResponse, error)
	GetService(context.Context, *vipdv1.GetServiceRequest) (*vipdv1.GetServiceResponse, error)
}

// Observer is told, after every scan, which files are in error: file name
// → the field of its first error ("" for the file as a whole). The
// daemon's metrics implement it (vipd_services_dir_errors).
type Observer interface {
	SetServicesDirErrors(fields map[string]string)
}

// Config configures a Watcher.
type Config struct {
	// Dir is the directory; it must exist.
	Dir string
	// NodeName is this node's name, for the endpoints of Kubernetes
	// EndpointSlices that are node-local (manifest.Options.NodeName).
	NodeName string
	// RescanPeriod is how often the directory is read without an event;
	// zero means DefaultRescanPeriod.
	RescanPeriod time.Duration
	// Debounce is how long events are merged before a scan; zero means
	// DefaultDebounce.
	Debounce time.Duration
}

// Watcher applies one directory. Create it with New, run it with Run.
// Rescan and Warnings are safe for concurrent use.
type Watcher struct {
	log    hclog.Logger
	cfg    Config
	api    API
	obs    Observer
	rescan chan struct{}
	synced chan struct{}

	// files is the state of every file seen and not yet deleted, by name;
	// only the scanning goroutine writes it.
	files map[string]*file

	mu       sync.Mutex
	warnings []*vipdv1.StatusWarning
}

// file is what the watcher knows of one file.
type file struct {
	data    []byte    // what was last read
	err     *fileErr  // nil: data is in force
	retry   bool      // err may go away without a change of the file (a conflict, a failed apply)
	applied bool      // some version of the file was applied by this watcher
	since   time.Time // when err was first seen
}

// fileErr is why a file is not in force.
type fileErr struct {
	field  string // the field of the first error; "" for the file
	msg    string // the whole error, naming the file
	remedy string
}

// New returns a Watcher of cfg.Dir applying through api and reporting to
// obs (which may be nil). It fails if cfg.Dir is not a readable directory.
func New(log hclog.Logger, cfg Config, api API, obs Observer) (*Watcher, error) {
	if cfg.RescanPeriod <= 0 {
		cfg.RescanPeriod = DefaultRescanPeriod
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = DefaultDebounce
	}
	if _, err := os.ReadDir(cfg.Dir); err != nil {
		return nil, fmt.Errorf("--services-dir: %w", err)
	}
	return &Watcher{log: log, cfg: cfg, api: api, obs: obs, rescan: make(chan struct{}, 1),
		synced: make(chan struct{}), files: map[string]*file{}}, nil
}

// Rescan asks Run for a full scan: every file is synced again, and the
// services of "file:" owners whose file is gone are deleted. It does not
// wait; requests made while one is pending are merged.
func (w *Watcher) Rescan() {
	select {
	case w.rescan <- struct{}{}:
	default:
	}
}

// Synced is closed once the first scan is done: every file that could be
// applied is.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Warnings are the GetStatus warnings of the files in error, in name
// order, after the last scan.
func (w *Watcher) Warnings() []*vipdv1.StatusWarning {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.warnings)
}

// Run scans the directory, then watches it until ctx ends: a scan after
// each burst of events (merged for Config.Debounce), every
// Config.RescanPeriod, and a full scan on each Rescan. It returns ctx's
// error. When fsnotify cannot watch the directory, it logs why and goes on
// with the periodic scans.
func (w *Watcher) Run(ctx context.Context) error {
	var events <-chan fsnotify.Event
	var errs <-chan error
	fw, err := fsnotify.NewWatcher()
	if err == nil {
		if err = fw.Add(w.cfg.Dir); err != nil {
			fw.Close()
		}
	}
	if err != nil {
		w.log.Error("cannot watch the services directory; it is scanned every rescan period only", "dir", w.cfg.Dir, "period", w.cfg.RescanPeriod, "error", err)
	} else {
		defer fw.Close()
		events, errs = fw.Events, fw.Errors
	}
	w.scan(ctx, true)
	close(w.synced)

	ticker := time.NewTicker(w.cfg.RescanPeriod)
	defer ticker.Stop()
	debounce := time.NewTimer(0)
	if !debounce.Stop() {
		<-debounce.C
	}
	pending := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			w.log.Trace("event", "event", ev.String())
			if !pending {
				// Not reset by later events, so that a steady stream of
				// writes still gets a scan every Debounce.
				debounce.Reset(w.cfg.Debounce)
				pending = true
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// Events may have been lost (an overflowed queue): read
			// everything again.
			w.log.Warn("watching the services directory", "dir", w.cfg.Dir, "error", err)
			w.Rescan()
		case <-debounce.C:
			pending = false
			w.scan(ctx, false)
		case <-ticker.C:
			w.scan(ctx, false)
		case <-w.rescan:
			w.log.Info("rescanning the services directory", "dir", w.cfg.Dir)
			w.scan(ctx, true)
		}
	}
}

// wanted reports whether name is a service file: *.yaml, *.yml or *.json,
// not hidden.
func wanted(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	switch filepath.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// scan reads the directory and applies what changed: the files that are
// gone, then those that are new, changed or were refused for a reason that
// may have passed (full: every file, and the owners of files gone while
// vipd did not watch). Files refused for a conflict are tried again as long
// as another file's change lets one more through, so that a VIP:port that
// moves from one file to another in one scan moves whatever the names'
// order.
func (w *Watcher) scan(ctx context.Context, full bool) {
	entries, err := os.ReadDir(w.cfg.Dir)
	if err != nil {
		// Nothing is deleted over a directory that cannot be read.
		w.log.Error("cannot read the services directory; what it applied stays in force", "dir", w.cfg.Dir, "error", err)
		w.report(&fileErr{msg: fmt.Sprintf("services directory %s: %v; what it applied stays in force", w.cfg.Dir, err),
			remedy: "make the directory readable by vipd"})
		return
	}
	present := map[string]bool{}
	var names []string // name order, as ReadDir sorts
	for _, e := range entries {
		if !wanted(e.Name()) {
			continue
		}
		// Stat follows a symbolic link, as Kubernetes volumes make them.
		if fi, err := os.Stat(filepath.Join(w.cfg.Dir, e.Name())); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		present[e.Name()] = true
		names = append(names, e.Name())
	}

	gone := map[string]bool{}
	for name := range w.files {
		if !present[name] {
			gone[name] = true
		}
	}
	if full {
		// Files deleted while vipd did not watch left their owners behind.
		resp, err := w.api.ListServices(ctx, &vipdv1.ListServicesRequest{})
		if err != nil {
			w.log.Error("list services to find those of deleted files", "error", err)
		}
		for _, s := range resp.GetServices() {
			if name, ok := strings.CutPrefix(s.GetOwner(), validation.FileOwnerPrefix); ok && !present[name] {
				gone[name] = true
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(gone)) {
		w.remove(ctx, name)
	}

	var retry []string
	for _, name := range names {
		ok, again := w.apply(ctx, name, full)
		if !ok && again {
			retry = append(retry, name)
		}
	}
	// A file refused for a conflict may pass once another file has let
	// go; each round applies at least one more file or stops.
	for len(retry) > 0 {
		var still []string
		for _, name := range retry {
			if ok, again := w.apply(ctx, name, true); !ok && again {
				still = append(still, name)
			}
		}
		if len(still) == len(retry) {
			break
		}
		retry = still
	}
	w.report(nil)
}

// remove deletes the services of the file name, which is gone.
func (w *Watcher) remove(ctx context.Context, name string) {
	owner := validation.FileOwner(name)
	resp, err := w.api.SyncServices(ctx, &vipdv1.SyncServicesRequest{Owner: owner})
	if err != nil {
		if len(validation.Owner(owner, "owner")) > 0 {
			// A file whose name cannot be an owner never had services.
			delete(w.files, name)
			return
		}
		w.log.Error("file removed, but its services could not be deleted; retrying at the next scan", "file", name, "error", err)
		if f := w.files[name]; f != nil {
			f.data = nil
		}
		return
	}
	delete(w.files, name)
	if len(resp.GetDeleted()) > 0 {
		w.log.Info("file removed: its services are deleted", "file", name, "owner", owner, "deleted", resp.GetDeleted())
	}
}

// apply reads the file name and syncs its services, unless it is
// unchanged since it was applied or refused for good (force ignores
// that). It reports whether the file is in force, and, if not, whether
// trying again without a change of the file may help.
func (w *Watcher) apply(ctx context.Context, name string, force bool) (ok, retry bool) {
	f := w.files[name]
	if f == nil {
		f = &file{}
		w.files[name] = f
	}
	data, err := os.ReadFile(filepath.Join(w.cfg.Dir, name))
	if err != nil {
		w.fail(name, f, &fileErr{msg: fmt.Sprintf("%s: %v", name, err), remedy: "make the file readable by vipd"}, true)
		return false, false
	}
	if !force && f.data != nil && bytes.Equal(data, f.data) && (f.err == nil || !f.retry) {
		return f.err == nil, false
	}
	f.data = data
	owner := validation.FileOwner(name)
	if v := validation.Owner(owner, "owner"); len(v) > 0 {
		w.fail(name, f, &fileErr{msg: fmt.Sprintf("%s: the file name cannot be an owner: %s", name, v[0].Description),
			remedy: "rename the file to lowercase letters, digits and \"-._\""}, false)
		return false, false
	}
	l := manifest.NewLoader(manifest.Options{NodeName: w.cfg.NodeName})
	var res *manifest.Result
	if err = l.Read(bytes.NewReader(data), name); err == nil {
		res, err = l.Result()
	}
	if err != nil {
		w.fail(name, f, fileError(name, err), false)
		return false, false
	}
	for _, n := range res.Notes {
		w.log.Warn("file "+name+": "+n, "file", name)
	}
	// SyncServices takes the services over (it drops and normalizes them
	// in place); the request gets a list of its own.
	svcs := slices.Clone(res.Services)
	resp, err := w.api.SyncServices(ctx, &vipdv1.SyncServicesRequest{Owner: owner, Services: svcs})
	if err != nil {
		if ctx.Err() != nil {
			return false, false
		}
		fe, again := w.syncError(ctx, name, res, err)
		w.fail(name, f, fe, again)
		return false, again
	}
	changed := len(resp.GetCreated()) + len(resp.GetUpdated()) + len(resp.GetDeleted())
	if f.err != nil || changed > 0 || !f.applied {
		w.log.Info("file applied", "file", name, "owner", owner, "services", len(res.Services),
			"created", len(resp.GetCreated()), "updated", len(resp.GetUpdated()), "deleted", len(resp.GetDeleted()))
	}
	f.err, f.retry, f.applied = nil, false, true
	return true, false
}

// fail records fe as the file's error, logging it when it is new.
func (w *Watcher) fail(name string, f *file, fe *fileErr, retry bool) {
	if f.err == nil || f.err.msg != fe.msg {
		w.log.Error("file not applied; its last good version stays in force", "file", name, "field", fe.field, "error", fe.msg)
		if f.err == nil {
			f.since = time.Now()
		}
	}
	f.err, f.retry = fe, retry
}

// fileError is a manifest error of the file name: its field is the path
// the decoder names.
func fileError(name string, err error) *fileErr {
	fe := &fileErr{msg: err.Error(), remedy: "fix the file; vipd applies it as soon as it is written"}
	var me *manifest.Error
	if errors.As(err, &me) {
		fe.field = me.Path
	}
	if !strings.HasPrefix(fe.msg, name) {
		fe.msg = name + ": " + fe.msg
	}
	return fe
}

// Conflicts as vipd words them (store.ConflictError, and SyncServices'
// refusal of another owner's name).
var (
	claimRE = regexp.MustCompile(`^service (\S+): (\S+) is already used by service (\S+)$`)
	// useClaimRE is the form of every claim but a VIP's: a node port, a
	// health-check node port, an external or load-balancer IP:port, with
	// the field of each side, such as "service a: node port 30080/TCP
	// (its ports[0].node_port) is already used by service b (its
	// health_check_node_port)".
	useClaimRE = regexp.MustCompile(`^service (\S+): (.+) \(its (\S+)\) is already used by service (\S+) \(its \S+\)$`)
	ownerRE    = regexp.MustCompile(`^service (\S+) belongs to owner (\S+);`)
)

// syncError places vipd's refusal of the file name's services (res) in the
// file, and says whether it may pass without a change of the file.
func (w *Watcher) syncError(ctx context.Context, name string, res *manifest.Result, err error) (*fileErr, bool) {
	st := status.Convert(err)
	at := func(svc string) (manifest.Origin, bool) {
		for i, s := range res.Services {
			if s.GetName() == svc {
				return res.Origins[i], true
			}
		}
		return manifest.Origin{}, false
	}
	switch st.Code() {
	case codes.InvalidArgument:
		var errs []*manifest.Error
		for _, d := range st.Details() {
			br, ok := d.(*errdetails.BadRequest)
			if !ok {
				continue
			}
			for _, v := range br.GetFieldViolations() {
				var i int
				if n, _ := fmt.Sscanf(v.GetField(), "services[%d]", &i); n == 1 && i >= 0 && i < len(res.Services) {
					_, rest, _ := strings.Cut(v.GetField(), "]")
					errs = append(errs, res.Origins[i].Error(res.Services[i].GetName(), strings.TrimPrefix(rest, "."), errors.New(v.GetDescription())))
					continue
				}
				errs = append(errs, &manifest.Error{Source: name, Path: v.GetField(), Err: errors.New(v.GetDescription())})
			}
		}
		if len(errs) == 0 {
			return &fileErr{msg: name + ": " + st.Message(), remedy: "fix the file"}, false
		}
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = e.Error()
		}
		return &fileErr{field: errs[0].Path, msg: strings.Join(msgs, "; "), remedy: "fix the file; vipd applies it as soon as it is written"}, false
	case codes.AlreadyExists:
		svc, what, holder, use := "", "", "", ""
		if m := claimRE.FindStringSubmatch(st.Message()); m != nil {
			svc, what, holder = m[1], m[2], m[3]
		} else if m := useClaimRE.FindStringSubmatch(st.Message()); m != nil {
			svc, what, use, holder = m[1], m[2], m[3], m[4]
		} else if m := ownerRE.FindStringSubmatch(st.Message()); m != nil {
			svc, what, holder = m[1], "the name "+m[1], m[1]
		}
		if svc == "" {
			break
		}
		by := "service " + holder
		if h, err := w.api.GetService(ctx, &vipdv1.GetServiceRequest{Name: holder}); err == nil {
			if other, ok := strings.CutPrefix(h.GetService().GetOwner(), validation.FileOwnerPrefix); ok {
				by = fmt.Sprintf("service %s of file %s", holder, other)
			} else {
				by = fmt.Sprintf("service %s of owner %s", holder, h.GetService().GetOwner())
			}
		}
		field := ""
		if o, ok := at(svc); ok {
			field = use
			if field == "" {
				field = claimField(res, svc, what)
			}
			e := o.Error(svc, field, fmt.Errorf("claims %s, which %s holds already; %s is refused until one of them gives it up", what, by, name))
			return &fileErr{field: e.Path, msg: e.Error(), remedy: "remove " + what + " from one of the two files"}, true
		}
		return &fileErr{msg: fmt.Sprintf("%s: service %s claims %s, which %s holds already; %s is refused until one of them gives it up", name, svc, what, by, name),
			remedy: "remove " + what + " from one of the two files"}, true
	}
	return &fileErr{msg: fmt.Sprintf("%s: %s (%s)", name, st.Message(), st.Code()), remedy: "see vipd's log"}, true
}

// claimField names the field of service svc (in res) that makes claim
// what, a VIP:port/protocol: the VIP's entry of vips, or name for a
// service name.
func claimField(res *manifest.Result, svc, what string) string {
	vip, _, ok := strings.Cut(what, "/")
	ap, err := netip.ParseAddrPort(vip)
	if !ok || err != nil {
		return "name"
	}
	for _, s := range res.Services {
		if s.GetName() != svc {
			continue
		}
		for i, v := range s.GetVips() {
			if a, err := netip.ParseAddr(v); err == nil && a.Unmap() == ap.Addr().Unmap() {
				return fmt.Sprintf("vips[%d]", i)
			}
		}
	}
	return "vips"
}

// report publishes the files' errors, and dirErr (the directory's own,
// when it cannot be read), to Warnings and the Observer.
func (w *Watcher) report(dirErr *fileErr) {
	var ws []*vipdv1.StatusWarning
	fields := map[string]string{}
	if dirErr != nil {
		ws = append(ws, &vipdv1.StatusWarning{Check: WarningCheck, Message: dirErr.msg, Remedy: dirErr.remedy, Since: timestamppb.Now()})
		fields[w.cfg.Dir] = ""
	}
	for _, name := range slices.Sorted(maps.Keys(w.errored())) {
		f := w.files[name]
		kept := "; its last good version stays in force"
		if !f.applied {
			// Not since vipd started: the state may hold an older version.
			kept = "; its last good version, if any, stays in force"
		}
		ws = append(ws, &vipdv1.StatusWarning{
			Check:   WarningCheck + "/" + name,
			Message: f.err.msg + kept,
			Remedy:  f.err.remedy,
			Since:   timestamppb.New(f.since),
		})
		fields[name] = f.err.field
	}
	w.mu.Lock()
	w.warnings = ws
	w.mu.Unlock()
	if w.obs != nil {
		w.obs.SetServicesDirErrors(fields)
	}
}

// errored is the set of files in error.
func (w *Watcher) errored() map[string]bool {
	out := map[string]bool{}
	for name, f := range w.files {
		if f.err != nil {
			out[name] = true
		}
	}
	return out
}
