package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
)

// Name is the iptables dataplane's name.
const Name = "iptables"

// Config configures the iptables dataplane.
type Config struct {
	// NetNS is the path of the network namespace to program; empty means the
	// current one.
	NetNS string
	// Mode picks the iptables binaries; ModeAuto decides at start-up.
	Mode Mode
	// Render tunes the rules.
	Render Options
	// SetFlowSysctls lets the dataplane turn on flowSysctls (conntrack
	// accounting, timestamps and events) in NetNS, when it opens and
	// after each Apply until that works; vipd sets it from --set-sysctls.
	// Without it they are only read, and the flow source works with what
	// is there: with nf_conntrack_acct or nf_conntrack_timestamp off,
	// flows carry zero counters and no start time; with
	// nf_conntrack_events at its default of 2, a connection reports its
	// close only if it began while a WatchFlows stream was open.
	SetFlowSysctls bool
}

// Dataplane programs vipd's services as iptables rules with
// iptables-restore --noflush, one atomic commit per family and table, in
// the order commitSteps gives, touching nothing outside vipd's chains and
// hooks. It diffs against what it last applied (a partial sync) and
// rebuilds fully after any error and on the first Apply.
type Dataplane struct {
	log hclog.Logger
	cfg Config
	run runner
	ct  *conntrackCleaner

	mu      sync.Mutex
	applied *Ruleset
	state   map[string]*dataplane.Service
	// nodePorts is the applied State's Node.NodePortAddresses.
	nodePorts []netip.Addr
	needFull  bool
	last      SyncStats
	// flowAccounting is set once flowSysctls are in force.
	flowAccounting bool
	// verified (nft mode only) says that at nf_tables generation
	// verifiedGen the kernel held what DetectDrift checks of applied: a
	// full sync or a DetectDrift that found nothing ended there, and
	// every commit since has been one of vipd's partial syncs. While the generation
	// stays there, DetectDrift has nothing to look at (see nftGen).
	verified    bool
	verifiedGen uint32
}

// SyncStats describes the last successful Apply.
type SyncStats struct {
	Stats
	// Full is true when the Apply diffed against the kernel's rules.
	Full bool
}

// LastSync describes the last successful Apply.
func (d *Dataplane) LastSync() SyncStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// New opens the iptables dataplane: it resolves the mode, checks that the
// tools work in the namespace, prepares conntrack access, and, with
// Config.SetFlowSysctls only, turns on conntrack accounting, timestamps and
// events in the namespace for the flow source (see flowSysctls; if that
// fails, because conntrack is not loaded yet, each Apply tries again until
// it works). It changes no rules; the first Apply does.
func New(ctx context.Context, log hclog.Logger, cfg Config) (*Dataplane, error) {
	if _, err := cfg.Render.withDefaults(); err != nil {
		return nil, err
	}
	mode, err := resolveMode(ctx, log, cfg.NetNS, cfg.Mode)
	if err != nil {
		return nil, err
	}
	cfg.Mode = mode
	ct, err := newConntrackCleaner(log.Named("conntrack"), cfg.NetNS)
	if err != nil {
		return nil, err
	}
	d := &Dataplane{log: log, cfg: cfg, run: runner{netns: cfg.NetNS, mode: mode}, ct: ct, needFull: true}
	d.enableFlowAccounting()
	return d, nil
}

// enableFlowAccounting sets flowSysctls unless they are set already or
// Config.SetFlowSysctls is off. A failure only costs flows their counters,
// so it is logged.
func (d *Dataplane) enableFlowAccounting() {
	if d.flowAccounting || !d.cfg.SetFlowSysctls {
		return
	}
	changed, err := d.ct.enableFlowAccounting()
	for _, c := range changed {
		d.log.Info("--set-sysctls: set sysctl", "sysctl", c)
	}
	if err != nil {
		d.log.Warn("flows will lack counters and timestamps until this works", "error", err)
		return
	}
	d.flowAccounting = true
}

// resolveMode checks that the requested mode's tools work and, for auto,
// picks one: the mode whose tables already hold vipd chains (so a restart
// continues where it left off), else nft, the Debian default, else legacy.
// Both the check and the search read only the filter table, where vipd
// always keeps its reject chain: the nat table can hold millions of rules,
// and iptables-nft-save 1.8.9 crashes on some of those (it did on 100,000
// services × 10 backends), which must not make auto pick the wrong mode.
//
// Neither creates a table: the mode not chosen must be left as it was
// found (see filterSave).
func resolveMode(ctx context.Context, log hclog.Logger, netns string, want Mode) (Mode, error) {
	works := func(m Mode) ([]byte, error) {
		return runner{netns: netns, mode: m}.filterSave(ctx)
	}
	if want != ModeAuto {
		if _, err := works(want); err != nil {
			return "", fmt.Errorf("iptables mode %s does not work here: %w", want, err)
		}
		return want, nil
	}
	var usable []Mode
	for _, m := range []Mode{ModeNFT, ModeLegacy} {
		save, err := works(m)
		if err != nil {
			log.Debug("iptables mode unusable", "mode", m, "error", err)
			continue
		}
		if len(ParseSave(save)) > 0 {
			log.Info("iptables mode chosen: vipd chains already present", "mode", m)
			return m, nil
		}
		usable = append(usable, m)
	}
	if len(usable) == 0 {
		return "", errors.New("neither iptables-nft nor iptables-legacy works here; install Debian's iptables package")
	}
	log.Info("iptables mode chosen", "mode", usable[0], "usable", usable)
	return usable[0], nil
}

// filterSave returns iptables-save output of the IPv4 filter table, and
// fails when the mode's tools do not work. It creates nothing:
// iptables-nft-save only reads, but iptables-legacy-save -t filter would
// create an empty legacy filter table, so in legacy mode a filter table the
// namespace lacks reads as empty, after a check that the kernel supports
// legacy tables (legacySupported) and that the tool runs.
func (r runner) filterSave(ctx context.Context) ([]byte, error) {
	if r.mode == ModeLegacy {
		names, err := r.legacyTables(IPv4)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(names, string(Filter)) {
			if err := r.legacySupported(IPv4); err != nil {
				return nil, err
			}
			_, err := r.run(ctx, nil, r.mode.tool(IPv4, "save"), "--version")
			return nil, err
		}
	}
	return r.saveTable(ctx, IPv4, string(Filter))
}

// Name implements dataplane.Dataplane.
func (d *Dataplane) Name() string { return Name }

// Mode is the resolved iptables mode.
func (d *Dataplane) Mode() Mode { return d.cfg.Mode }

// Capabilities implements dataplane.Dataplane.
func (d *Dataplane) Capabilities() dataplane.Capabilities { return Capabilities() }

// Apply implements dataplane.Dataplane. A partial sync rewrites only the
// chains that changed since the last Apply. A full sync (the first Apply, any
// Apply after an error, and an Apply whose State.Changed is nil) diffs
// against the rules iptables-save shows instead, so it also repairs drift,
// deletes stale chains and (re)installs missing hooks. Each restore commits
// one table of one family, in the order commitSteps gives, so that no port
// is ever left with neither its DNAT nor its REJECT. If a restore fails,
// the restores already run are undone, last first (runSteps), so the old
// state stays in force.
func (d *Dataplane) Apply(ctx context.Context, s *dataplane.State) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	start := time.Now()
	next, err := Render(s, d.cfg.Render, d.applied)
	if err != nil {
		return err
	}
	rendered := time.Now()
	// A full sync diffs against what the kernel really holds rather than
	// against what vipd last wrote: chains that already match are left alone
	// (a restart neither flushes nor re-adds anything), others are rewritten,
	// stale ones are deleted, and missing hooks are installed.
	full := d.needFull || s.Changed == nil
	d.needFull = true // until this Apply succeeds
	// Whether the rules stay verified (see verifyAfter): a full sync
	// reads the generation before the save it diffs against; a partial
	// sync of verified rules counts its commits from the generation they
	// were verified at, so that nothing is read before its restores.
	wasVerified, genBefore, genErr := d.verified, d.verifiedGen, error(nil)
	d.verified = false // until this Apply succeeds
	if d.cfg.Mode == ModeNFT && full {
		genBefore, genErr = d.run.nftGen()
	}
	old := d.applied
	var saves map[Family][]byte
	if full {
		if saves, err = d.saveAll(ctx); err != nil {
			return err
		}
		old = RulesetFromSave(saves)
	}
	updates := Payload(old, next, false, nil)
	var steps []restoreStep
	var hooksAdded [2][]string
	var stats Stats
	for _, u := range updates {
		// A table whose hooks are missing needs a restore even if none of
		// its chains changes.
		var hooksMissing [2]bool
		if full {
			for i, t := range tables {
				_, added := withHooks(nil, u.Family, t, saves[u.Family])
				hooksMissing[i] = len(added) > 0
			}
		}
		for _, st := range commitSteps(old, next, u, hooksMissing) {
			if d.cfg.Mode == ModeNFT && st.chains >= bulkChains {
				st.payload = withChainListFetch(st.payload)
			}
			if full && st.hooks {
				var added []string
				st.payload, added = withHooks(st.payload, st.family, st.table, saves[st.family])
				hooksAdded[st.family] = append(hooksAdded[st.family], added...)
			}
			steps = append(steps, st)
		}
		stats.ChainsRewritten += u.ChainsRewritten
		stats.RulesWritten += u.RulesWritten
		stats.ChainsDeleted += u.ChainsDeleted
	}
	restoring := time.Now()
	if err := runSteps(ctx, d.log, d.run.restore, steps); err != nil {
		return err
	}
	restored := time.Now()
	if d.cfg.Mode == ModeNFT && genErr == nil && (full || wasVerified) {
		d.verifyAfter(genBefore, steps)
	}
	// A map of every service: Render walked them all already, and the
	// conntrack cleaner and Explain look them up.
	svcs := s.Map()
	nodePorts := slices.Clone(s.Node.NodePortAddresses)
	d.ct.cleanup(udpView{d.state, d.nodePorts}, udpView{svcs, nodePorts})
	d.applied, d.state, d.nodePorts, d.needFull = next, svcs, nodePorts, false
	d.last = SyncStats{Stats: stats, Full: full}
	d.enableFlowAccounting()
	if full {
		d.logFullSync(updates, hooksAdded)
	}
	d.log.Debug("applied", "full", full, "services", len(svcs), "chains_rewritten", stats.ChainsRewritten,
		"rules_written", stats.RulesWritten, "chains_deleted", stats.ChainsDeleted, "restores", len(steps), "elapsed", time.Since(start),
		// Where a partial sync's time goes; see doc.go on the restores.
		"render_elapsed", rendered.Sub(start), "diff_elapsed", restoring.Sub(rendered), "restore_elapsed", restored.Sub(restoring))
	return nil
}

// verifyAfter marks the rules verified at the current nf_tables
// generation after the restores of steps ran without error, if the
// generation moved from before by exactly one commit per restore: no other
// tool committed anything in between (the generation only grows, by one
// per commit), so the kernel holds what vipd applied. before is the
// generation read before a full sync's save (which it diffs against and
// repairs everything it finds), or, for a partial sync, the one the rules
// were verified at. A failure to read the generation only leaves them
// unverified, which costs the next DetectDrift its full check.
func (d *Dataplane) verifyAfter(before uint32, steps []restoreStep) {
	after, err := d.run.nftGen()
	if err != nil {
		d.log.Debug("rules left unverified", "error", err)
		return
	}
	var commits uint32
	for _, st := range steps {
		if st.payload != nil {
			commits++
		}
	}
	if after-before == commits {
		d.verified, d.verifiedGen = true, after
	}
}

// bulkChains is how many rewritten chains make a payload a bulk load.
const bulkChains = 1000

// withChainListFetch makes iptables-nft-restore fetch the kernel's chain list
// once per table, with a leading -S, instead of looking every chain of the
// payload up in a sorted list one by one: iptables-nft 1.8.9 is quadratic in
// the chains a payload names without it (10,000 services: minutes). The
// listing costs time proportional to the table, so it pays off only for bulk
// loads. Its output is discarded.
func withChainListFetch(payload []byte) []byte {
	text := string(payload)
	for _, t := range tables {
		header := "*" + string(t) + "\n"
		text = strings.Replace(text, header, header+"-S\n", 1)
	}
	return []byte(text)
}

func (d *Dataplane) saveAll(ctx context.Context) (map[Family][]byte, error) {
	saves := map[Family][]byte{}
	for _, f := range families {
		save, err := d.run.save(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("read %s rules: %w", f, err)
		}
		if d.cfg.Mode == ModeNFT {
			// A table with another tool's nft rules prints no rule:
			// add the hooks in place, so that none is added twice.
			hooks, err := d.run.nftHookLines(f, save)
			if err != nil {
				return nil, fmt.Errorf("read %s hooks: %w", f, err)
			}
			save = append(save, hooks...)
		}
		saves[f] = save
	}
	return saves, nil
}

// maxLoggedChains is the most chain names a full sync's log line lists.
const maxLoggedChains = 10

// logFullSync logs, at INFO and per family, what a successful full sync
// changed: a full sync that finds the kernel as it should be logs nothing,
// so each line is news (a restart with changes, or repaired drift).
func (d *Dataplane) logFullSync(updates []Update, hooksAdded [2][]string) {
	for _, u := range updates {
		if u.Restore == nil && len(hooksAdded[u.Family]) == 0 {
			continue
		}
		args := []any{"family", u.Family, "chains_rewritten", u.ChainsRewritten, "rules_written", u.RulesWritten,
			"chains_deleted", u.ChainsDeleted}
		if hooks := hooksAdded[u.Family]; len(hooks) > 0 {
			args = append(args, "hooks_added", hooks)
		}
		var names []string
		for i, t := range tables {
			for _, c := range slices.Concat(u.Rewritten[i], u.Deleted[i]) {
				names = append(names, string(t)+" "+c)
			}
		}
		if len(names) <= maxLoggedChains {
			args = append(args, "chains", names)
		}
		d.log.Info("full sync changed the rules", args...)
	}
}

// withHooks adds to section, a payload section of table t (nil: none),
// the hook rules of t that save lacks, each inserted at the top of its
// builtin chain; with no section, it makes one that holds just them. It
// also returns the hooks it adds, as "nat PREROUTING -> VIPD-SERVICES".
//
// The hooks go first in the section, after declarations of the chains they
// jump to that the section declares (creates or rewrites) anyway; those it
// does not declare exist already. They must come before a leading -S
// (withChainListFetch): in a table that does not exist yet, the listing
// makes iptables-nft 1.8.9 cache builtin chains that are not there, and a
// hook inserted after it fails with "RULE_INSERT failed (No such file or
// directory)". A chain declared twice is flushed twice, in one transaction.
func withHooks(section []byte, f Family, t Table, save []byte) ([]byte, []string) {
	present := lineSet(save)
	header := "*" + string(t) + "\n"
	text := string(section)
	var declare, insert strings.Builder
	var added []string
	for _, h := range Hooks(f) {
		if h.Table != t || present[hookLine("-A", h)] {
			continue
		}
		decl := ":" + h.Target() + " - [0:0]\n"
		if strings.Contains(text, "\n"+decl) && !strings.Contains(declare.String(), decl) {
			declare.WriteString(decl)
		}
		insert.WriteString(hookLine("-I", h) + "\n")
		added = append(added, string(h.Table)+" "+h.Chain+" -> "+h.Target())
	}
	if insert.Len() == 0 {
		return section, nil
	}
	if text == "" {
		return []byte(header + insert.String() + "COMMIT\n"), added
	}
	return []byte(strings.Replace(text, header, header+declare.String()+insert.String(), 1)), added
}

func lineSet(save []byte) map[string]bool {
	set := map[string]bool{}
	for line := range strings.Lines(string(save)) {
		set[strings.TrimSpace(line)] = true
	}
	return set
}

// hookLine is h as an iptables-save line for op (-A, -D or -I, which inserts
// at the top), such as
// `-A PREROUTING -m comment --comment "vipd service VIPs" -j VIPD-SERVICES`.
func hookLine(op string, h HookRule) string {
	if op == "-I" {
		return op + " " + h.Chain + " 1 " + h.rule()
	}
	return op + " " + h.Chain + " " + h.rule()
}

// rule is h's rule specification quoted the way iptables-save prints it.
func (h HookRule) rule() string {
	parts := make([]string, len(h.Args))
	for i, a := range h.Args {
		if strings.ContainsAny(a, " \t") {
			a = `"` + a + `"`
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}

// Close implements dataplane.Dataplane. The rules stay in the kernel.
func (d *Dataplane) Close() error { return d.ct.close() }

// Cleanup removes every vipd hook and chain, in both families, from the
// namespace at netns in the given mode (ModeAuto: every mode that works).
func Cleanup(ctx context.Context, log hclog.Logger, netns string, mode Mode) error {
	modes := []Mode{mode}
	if mode == ModeAuto {
		modes = []Mode{ModeNFT, ModeLegacy}
	}
	var errs []error
	for _, m := range modes {
		r := runner{netns: netns, mode: m}
		for _, f := range families {
			save, err := r.save(ctx, f)
			if err != nil {
				if mode != ModeAuto {
					errs = append(errs, err)
				}
				continue
			}
			existing := ParseSave(save)
			if len(existing) == 0 {
				continue
			}
			payload := unhook(save, f)
			payload = append(payload, Payload(nil, nil, true, map[Family]ExistingChains{f: existing})[f].Restore...)
			if err := r.restore(ctx, f, payload); err != nil {
				errs = append(errs, fmt.Errorf("clean up %s %s rules: %w", m, f, err))
				continue
			}
			log.Info("removed vipd rules", "mode", m, "family", f, "chains", len(existing[NAT])+len(existing[Filter]))
		}
	}
	return errors.Join(errs...)
}

// unhook returns a payload that deletes every hook rule present in save.
func unhook(save []byte, f Family) []byte {
	present := lineSet(save)
	var b strings.Builder
	for _, t := range tables {
		var dels []string
		for _, h := range Hooks(f) {
			if h.Table == t && present[hookLine("-A", h)] {
				dels = append(dels, hookLine("-D", h))
			}
		}
		if len(dels) > 0 {
			b.WriteString("*" + string(t) + "\n" + strings.Join(dels, "\n") + "\nCOMMIT\n")
		}
	}
	return []byte(b.String())
}

var _ dataplane.Dataplane = (*Dataplane)(nil)
