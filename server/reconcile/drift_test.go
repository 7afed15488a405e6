package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/testkit/syncbuf"
	"github.com/vipd/vipd/server/reconcile"
	"github.com/vipd/vipd/server/store"
)

// driftPeriod is short so that the tests wait little; the checks below
// wait for conditions, never for a number of periods to pass, except to
// show that something does not happen.
const driftPeriod = 20 * time.Millisecond

// runLogged is run with the reconciler's log captured.
func runLogged(t *testing.T, dp *fake.Dataplane, initial *store.Snapshot, opts ...reconcile.Option) (*harness, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: logs})
	h := &harness{dp: dp, obs: &observer{}, p: &persister{}}
	h.rec = reconcile.New(log, dp, h.p, initial, append(opts, reconcile.WithObserver(h.obs))...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.rec.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return h, logs
}

// waitFor polls cond until it holds or 5 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fullApplies counts the successful applies without a change hint.
func fullApplies(dp *fake.Dataplane) int {
	n := 0
	for _, r := range dp.Records() {
		if r.Err == nil && r.State.Changed == nil {
			n++
		}
	}
	return n
}

// TestDriftRepairedWithFullSync checks that drift the dataplane reports is
// repaired with a full sync of the whole desired state within a period,
// logged (what was found at warn level, the repair at info level) and
// counted once per kind.
func TestDriftRepairedWithFullSync(t *testing.T) {
	dp := fake.New()
	initial := snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1"), put("b", "10.96.0.2", "10.0.0.2"))
	h, logs := runLogged(t, dp, initial, reconcile.WithDriftCheck(driftPeriod))
	<-h.rec.Ready()
	// A partial apply must not hide the drift.
	if err := h.do(t, put("c", "10.96.0.3", "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	before := len(dp.Records())
	dp.SetDrift([]dataplane.Drift{
		{What: "hook", Detail: "ipv4 nat PREROUTING: no jump to VIPD-SERVICES"},
		{What: "hook", Detail: "ipv4 nat OUTPUT: no jump to VIPD-SERVICES"},
		{What: "chain", Detail: "ipv6 filter: VIPD-REJECT missing"},
	})
	waitFor(t, "a repair", func() bool { return len(h.obs.driftRepairs()) > 0 })

	recs := dp.Records()[before:]
	if len(recs) != 1 || recs[0].Err != nil || recs[0].State.Changed != nil || len(recs[0].State.Services) != 3 {
		t.Fatalf("applies after the drift: %+v; want one full sync of the 3 services", recs)
	}
	if got, want := h.obs.driftRepairs(), []string{"fake/hook", "fake/chain"}; !slices.Equal(got, want) {
		t.Errorf("repairs observed %v, want %v (one per kind)", got, want)
	}
	checkSyncsMatchApplies(t, h)
	out := logs.String()
	for _, want := range []string{
		`[WARN]  dataplane drift; repairing with a full sync: what=hook detail="ipv4 nat PREROUTING: no jump to VIPD-SERVICES"`,
		`[WARN]  dataplane drift; repairing with a full sync: what=hook detail="ipv4 nat OUTPUT: no jump to VIPD-SERVICES"`,
		`[WARN]  dataplane drift; repairing with a full sync: what=chain detail="ipv6 filter: VIPD-REJECT missing"`,
		"[INFO]  dataplane drift repaired with a full sync: what=[\"hook\", \"chain\"]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}

	// Repaired: later checks find nothing and apply nothing.
	n, checks := len(dp.Records()), dp.DriftChecks()
	waitFor(t, "three more checks", func() bool { return dp.DriftChecks() >= checks+3 })
	if len(dp.Records()) != n || len(h.obs.driftRepairs()) != 2 {
		t.Errorf("applies %d → %d, repairs %v after the repair", n, len(dp.Records()), h.obs.driftRepairs())
	}
}

// TestUnrepairableDriftNotCounted checks that drift a full sync cannot
// repair is logged as an error after the sync and not counted as
// repaired, while the kinds the sync did repair are.
func TestUnrepairableDriftNotCounted(t *testing.T) {
	dp := fake.New()
	h, logs := runLogged(t, dp, snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1")), reconcile.WithDriftCheck(driftPeriod))
	<-h.rec.Ready()
	dp.SetUnrepairableDrift([]dataplane.Drift{{What: "tc-link", Detail: "veth9 ingress: vipd_from_pod not attached"}})
	dp.SetDrift([]dataplane.Drift{{What: "map", Detail: "vipd_services: 1 entries missing"}})
	waitFor(t, "a repair", func() bool { return len(h.obs.driftRepairs()) > 0 })
	waitFor(t, "the next repair attempt", func() bool { return fullApplies(dp) >= 3 })
	if got := h.obs.driftRepairs(); !slices.Equal(got, []string{"fake/map"}) {
		t.Errorf("repairs observed %v, want only the map (the tc link was never repaired)", got)
	}
	out := logs.String()
	for _, want := range []string{
		`[ERROR] dataplane drift remains after a full sync; retrying at the next check: what=tc-link detail="veth9 ingress: vipd_from_pod not attached"`,
		"[INFO]  dataplane drift repaired with a full sync: what=[\"map\"]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, `repaired with a full sync: what=["tc-link"]`) {
		t.Errorf("the unrepairable tc link was logged as repaired:\n%s", out)
	}
}

// TestNoDriftNoApply checks that a check that finds nothing applies
// nothing.
func TestNoDriftNoApply(t *testing.T) {
	dp := fake.New()
	h, _ := runLogged(t, dp, snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1")), reconcile.WithDriftCheck(driftPeriod))
	<-h.rec.Ready()
	waitFor(t, "five checks", func() bool { return dp.DriftChecks() >= 5 })
	if n := len(dp.Records()); n != 1 {
		t.Errorf("%d applies; want only the initial one", n)
	}
}

// TestDriftRepairFailureRetries checks that a repair whose full sync fails
// is logged as an error, not counted, and retried at the next check.
func TestDriftRepairFailureRetries(t *testing.T) {
	dp := fake.New()
	h, logs := runLogged(t, dp, snapshotOf(t, put("a", "10.96.0.1", "10.0.0.1")), reconcile.WithDriftCheck(driftPeriod))
	<-h.rec.Ready()
	dp.FailNext(errors.New("iptables-restore: exit status 4"))
	dp.SetDrift([]dataplane.Drift{{What: "map", Detail: "vipd_services replaced"}})
	waitFor(t, "a repair", func() bool { return len(h.obs.driftRepairs()) > 0 })
	if got := h.obs.driftRepairs(); !slices.Equal(got, []string{"fake/map"}) {
		t.Errorf("repairs %v, want one map repair (the failed one not counted)", got)
	}
	if fullApplies(dp) != 2 || len(dp.Records()) != 3 {
		t.Errorf("applies %+v; want the initial one, the failed repair and the retry", dp.Records())
	}
	if out := logs.String(); !strings.Contains(out, "[ERROR] dataplane drift repair failed; retrying at the next check: what=[\"map\"]") {
		t.Errorf("log lacks the failed repair:\n%s", out)
	}
	if st := h.rec.Status(); st.LastError != nil || !st.Ready {
		t.Errorf("status after the retry: %+v", st)
	}
}

// TestNoDriftCheckWhileHeld checks that a held reconciler never asks the
// dataplane for drift, and starts once the hold ends.
func TestNoDriftCheckWhileHeld(t *testing.T) {
	dp := fake.New()
	dp.SetDrift([]dataplane.Drift{{What: "hook", Detail: "gone"}})
	rec := runHeld(t, dp, &persister{}, reconcile.WithDriftCheck(time.Millisecond))
	time.Sleep(50 * time.Millisecond) // 50 periods
	if n := dp.DriftChecks(); n != 0 || len(dp.Records()) != 0 {
		t.Fatalf("while held: %d drift checks, %d applies; want none", n, len(dp.Records()))
	}
	if _, err := rec.Release(ctx10(t), put("a", "10.96.0.1", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a drift check after the release", func() bool { return dp.DriftChecks() > 0 })
}

// TestDriftCheckDisabled checks that a zero period checks nothing.
func TestDriftCheckDisabled(t *testing.T) {
	dp := fake.New()
	h, _ := runLogged(t, dp, store.Empty(), reconcile.WithDriftCheck(0), reconcile.WithResyncPeriod(time.Millisecond))
	<-h.rec.Ready()
	waitFor(t, "a few resyncs", func() bool { return len(dp.Records()) > 5 })
	if n := dp.DriftChecks(); n != 0 {
		t.Errorf("%d drift checks with the check disabled", n)
	}
}

// TestNoDriftCheckBeforeInitialApply checks that nothing asks for drift
// while the initial apply has not succeeded.
func TestNoDriftCheckBeforeInitialApply(t *testing.T) {
	dp := fake.New()
	release := make(chan struct{})
	dp.SetHook(func(context.Context, *dataplane.State) error { <-release; return nil })
	h, _ := runLogged(t, dp, store.Empty(), reconcile.WithDriftCheck(time.Millisecond))
	time.Sleep(50 * time.Millisecond) // 50 periods
	if n := dp.DriftChecks(); n != 0 {
		t.Errorf("%d drift checks before the initial apply", n)
	}
	dp.SetHook(nil)
	close(release)
	<-h.rec.Ready()
	waitFor(t, "a drift check after the initial apply", func() bool { return dp.DriftChecks() > 0 })
}

// TestDriftCheckErrorLoggedOnce checks that a drift check that cannot run
// applies nothing and is logged at warn level once, not every period, and
// that its recovery is logged.
func TestDriftCheckErrorLoggedOnce(t *testing.T) {
	dp := fake.New()
	dp.SetDriftError(errors.New("iptables-save: exit status 1"))
	h, logs := runLogged(t, dp, store.Empty(), reconcile.WithDriftCheck(driftPeriod))
	<-h.rec.Ready()
	waitFor(t, "five checks", func() bool { return dp.DriftChecks() >= 5 })
	dp.SetDriftError(nil)
	n := dp.DriftChecks()
	waitFor(t, "a check that works", func() bool { return dp.DriftChecks() > n+1 })
	out := logs.String()
	if c := strings.Count(out, "[WARN]  dataplane drift check failed; retrying every period: error=\"iptables-save: exit status 1\""); c != 1 {
		t.Errorf("the failing check was logged %d times, want once:\n%s", c, out)
	}
	if !strings.Contains(out, "[INFO]  dataplane drift check works again") {
		t.Errorf("no info line when the check worked again:\n%s", out)
	}
	if len(dp.Records()) != 1 {
		t.Errorf("%d applies; want only the initial one", len(dp.Records()))
	}
}

// stuckDrift is a fake whose drift check blocks until its context ends,
// as iptables --wait does while another tool holds the xtables lock.
type stuckDrift struct {
	*fake.Dataplane
	checks chan struct{} // takes a value when a check starts, if a receiver waits
}

func (d *stuckDrift) DetectDrift(ctx context.Context) ([]dataplane.Drift, error) {
	select {
	case d.checks <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestDriftCheckTimesOut checks that a drift check that does not finish is
// cancelled after its bound, so that a change submitted while it runs
// still completes, and that the timeout is logged at warn level as a
// failed check, with no repair.
func TestDriftCheckTimesOut(t *testing.T) {
	dp := &stuckDrift{Dataplane: fake.New(), checks: make(chan struct{})}
	logs := &syncbuf.Buffer{}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: logs})
	obs := &observer{}
	rec := reconcile.New(log, dp, &persister{}, store.Empty(), reconcile.WithDriftCheck(driftPeriod), reconcile.WithObserver(obs))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	<-rec.Ready()
	for i := range 3 {
		select {
		case <-dp.checks: // a check is running on the writer goroutine
		case <-time.After(5 * time.Second):
			t.Fatal("no drift check started")
		}
		// Do waits for a queued change however long the writer takes, so
		// the wait is bounded here.
		res := make(chan error, 1)
		go func() {
			_, err := rec.Do(context.Background(), put(fmt.Sprintf("s%d", i), fmt.Sprintf("10.96.0.%d", i+1), "10.0.0.1"))
			res <- err
		}()
		select {
		case err := <-res:
			if err != nil {
				t.Fatalf("change %d submitted during a stuck drift check: %v", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("change %d submitted during a stuck drift check did not complete in 5 s", i)
		}
	}
	out := logs.String()
	want := `[WARN]  dataplane drift check failed; retrying every period: error="timed out after 10ms, so as not to hold up changes any longer: context deadline exceeded"`
	if c := strings.Count(out, want); c != 1 {
		t.Errorf("the timed-out check was logged %d times, want once: %q\n%s", c, want, out)
	}
	if strings.Contains(out, "dataplane drift;") || len(obs.driftRepairs()) != 0 {
		t.Errorf("a timed-out check was taken for drift (repairs %v):\n%s", obs.driftRepairs(), out)
	}
	for _, r := range dp.Records() {
		if r.State.Changed == nil && r.State.Generation > 0 {
			t.Errorf("a full sync after a timed-out check: %+v", r)
		}
	}
}
