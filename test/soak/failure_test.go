package soak

import (
	"context"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// TestDataplaneFailure makes the dataplane fail an apply on purpose:
//   - iptables: a foreign rule in the node's nat table jumps to the chain
//     of the service being deleted, so iptables-restore cannot delete it;
//   - eBPF: a service with more backends than the backend map has room
//     for (vipd runs with --bpf-backend-map-max 16).
//
// The call gets an error (Unavailable; ResourceExhausted), the desired
// state does not change, GetStatus and vipd_sync_errors_total report the
// failure, and the old state stays in force: traffic to a service that is
// not involved never fails, and the service the call was about keeps
// answering as before. After the conflict is removed (or room is made),
// the next successful apply is a full one (vipd's debug log of the
// dataplane's apply says full=true), and the kernel holds exactly the
// desired state.
//
// Short form: 3 rounds. Full form: 10 rounds.
func TestDataplaneFailure(t *testing.T) {
	forEachDataplane(t, testDataplaneFailure)
}

// failedStateHold is how long the background traffic runs while the
// failure is in place.
const failedStateHold = 500 * time.Millisecond

func testDataplaneFailure(t *testing.T, dp string) {
	rounds := Pick(3, 10)
	var args []string
	if dp == "ebpf" {
		args = []string{"--bpf-lb-map-max", "1024", "--bpf-backend-map-max", "16"}
	}
	e := NewEnv(t, vipdBin, dp, Spec{Clients: []string{"c1"}, Backends: []string{"be1", "be2", "be3", "be4"}, VipdArgs: args})
	keep := service("soak/keep", "soak", VIP(0x301), backend(e.Pod("be1")), backend(e.Pod("be2")))
	e.Upsert(keep)
	traffic := StartTraffic(e.Pod("c1").NS, TrafficConfig{Workers: 2, Pause: 5 * time.Millisecond},
		Target{Addr: ap(VIP(0x301), 80), Backends: []string{"be1", "be2"}})
	defer traffic.Stop()

	for round := 1; round <= rounds; round++ {
		errsBefore, err := e.Vipd.Metric("vipd_sync_errors_total")
		if err != nil {
			t.Fatal(err)
		}
		var mark int
		switch dp {
		case "iptables":
			mark = failIptables(t, e, round)
		case "ebpf":
			mark = failEBPF(t, e, round)
		default:
			t.Fatalf("no failure to inject into dataplane %s", dp)
		}
		errsAfter, err := e.Vipd.Metric("vipd_sync_errors_total")
		if err != nil {
			t.Fatal(err)
		}
		if errsAfter < errsBefore+1 {
			t.Errorf("round %d: vipd_sync_errors_total went from %v to %v, want it to count the failed apply", round, errsBefore, errsAfter)
		}
		full, ok := nextDataplaneApply(e.Vipd.Entries()[mark:])
		if !ok {
			t.Fatalf("round %d: vipd logged no dataplane apply after the failure was removed", round)
		}
		if !full {
			t.Errorf("round %d: the first successful apply after the failure was a partial one, want a full one", round)
		}
		if err := e.CheckKernel(); err != nil {
			t.Fatalf("round %d: after recovery: %v", round, err)
		}
		if st := traffic.Stats(); st.Failed > 0 {
			t.Fatalf("round %d: traffic to the uninvolved service failed: %v", round, st)
		}
	}
	st := traffic.Stop()
	t.Logf("%s: %s", dp, summary("injected_failures", rounds, "full_apply_after_each", !t.Failed()))
	t.Logf("%s: traffic to the uninvolved service: %v", dp, st)
	if st.Failed > 0 || st.OK < 50 {
		t.Fatalf("traffic to the uninvolved service: %v; want no failure among at least 50 connections", st)
	}
}

// nextDataplaneApply finds the dataplane's first "applied" debug entry
// among entries (module vipd.dataplane.<name>) and reports whether it was
// a full apply.
func nextDataplaneApply(entries []LogEntry) (full, ok bool) {
	for _, e := range entries {
		if m := e.Module(); e.Message() == "applied" && (strings.HasSuffix(m, "dataplane.iptables") || strings.HasSuffix(m, "dataplane.ebpf")) {
			full, _ := e["full"].(bool)
			return full, true
		}
	}
	return false, false
}

// failIptables deletes a service whose chain a foreign rule references,
// then removes the rule and deletes it again. It returns the log position
// from which the successful delete's apply is logged.
func failIptables(t *testing.T, e *Env, round int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vip := VIP(0x302)
	victim := service("soak/victim", "soak", vip, backend(e.Pod("be3")))
	e.Upsert(victim)
	expectAnswer(t, e, round, "the victim service", ap(vip, 80), "be3")

	save, err := e.Node.Exec(ctx, "iptables-nft-save", "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`-d ` + regexp.QuoteMeta(vip.String()) + `/32 .* -j (VIPD-SVC-[A-Z2-7]+)`).FindStringSubmatch(save)
	if m == nil {
		t.Fatalf("round %d: no dispatch rule for %s in:\n%s", round, vip, save)
	}
	for _, args := range [][]string{{"-t", "nat", "-N", "SOAK-FOREIGN"}, {"-t", "nat", "-A", "SOAK-FOREIGN", "-j", m[1]}} {
		if _, err := e.Node.Exec(ctx, "iptables-nft", args...); err != nil {
			t.Fatal(err)
		}
	}
	removed := false
	removeConflict := func() {
		if !removed {
			removed = true
			e.Node.Exec(ctx, "iptables-nft", "-t", "nat", "-F", "SOAK-FOREIGN")
			e.Node.Exec(ctx, "iptables-nft", "-t", "nat", "-X", "SOAK-FOREIGN")
		}
	}
	defer removeConflict()

	err = e.API.DeleteService(ctx, victim.Name, 0)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("round %d: DeleteService of a service whose chain a foreign rule references: %v, want Unavailable", round, err)
	}
	checkFailedState(t, e, round, victim.Name, true)
	expectAnswer(t, e, round, "the victim service after its failed delete", ap(vip, 80), "be3")
	time.Sleep(failedStateHold)
	expectAnswer(t, e, round, "the victim service, a while after its failed delete", ap(vip, 80), "be3")

	removeConflict()
	mark := len(e.Vipd.Entries())
	if err := e.API.DeleteService(ctx, victim.Name, 0); err != nil {
		t.Fatalf("round %d: DeleteService once the foreign rule is gone: %v", round, err)
	}
	expectNoAnswer(t, e, round, "the deleted victim service", ap(vip, 80))
	return mark
}

// failEBPF upserts a service that does not fit the backend map, then makes
// room by deleting another and upserts it again. It returns the log
// position from which the apply that made room is logged.
func failEBPF(t *testing.T, e *Env, round int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// 2 backends of keep, 8 of the filler, 10 of big: 20 for a map of 16.
	filler := service("soak/filler", "soak", VIP(0x303))
	big := service("soak/big", "soak", VIP(0x304), backend(e.Pod("be3")), backend(e.Pod("be4")))
	for i := range 8 {
		// Members that take no connections, but hold backend entries.
		filler.Backends = append(filler.Backends, &vipdv1.Backend{Ip: netip.AddrFrom4([4]byte{198, 18, 1, byte(100 + i)}).String(),
			State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING})
		big.Backends = append(big.Backends, &vipdv1.Backend{Ip: netip.AddrFrom4([4]byte{198, 18, 1, byte(120 + i)}).String(),
			State: vipdv1.BackendState_BACKEND_STATE_NOT_SERVING})
	}
	e.Upsert(filler)

	_, err := e.API.UpsertService(ctx, big, 0)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("round %d: UpsertService of a service that does not fit the backend map: %v, want ResourceExhausted", round, err)
	}
	checkFailedState(t, e, round, big.Name, false)
	expectNoAnswer(t, e, round, "the refused service", ap(VIP(0x304), 80))
	time.Sleep(failedStateHold)

	mark := len(e.Vipd.Entries())
	if err := e.API.DeleteService(ctx, filler.Name, 0); err != nil {
		t.Fatalf("round %d: DeleteService of the filler: %v", round, err)
	}
	e.Upsert(big)
	expectAnswer(t, e, round, "the service once there was room", ap(VIP(0x304), 80), "be3", "be4")
	if err := e.API.DeleteService(ctx, big.Name, 0); err != nil {
		t.Fatalf("round %d: DeleteService of big: %v", round, err)
	}
	return mark
}

// checkFailedState checks, after a failed call about service name, that the
// desired state kept (exists) or did not get it, and that GetStatus
// reports the failure.
func checkFailedState(t *testing.T, e *Env, round int, name string, exists bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := e.API.GetService(ctx, name)
	if got := err == nil; got != exists {
		t.Fatalf("round %d: after the failed call, GetService %s: %v; want it to exist: %v (an error means nothing changed)", round, name, err, exists)
	}
	st, err := e.API.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetLastError() == "" {
		t.Errorf("round %d: GetStatus after the failed apply has no last_error", round)
	}
}

// expectAnswer makes 10 requests from c1 to dst; each must be answered by
// one of want.
func expectAnswer(t *testing.T, e *Env, round int, what string, dst netip.AddrPort, want ...string) {
	t.Helper()
	for i := range 10 {
		b, err := e.Request("c1", dst, 3*time.Second)
		if err != nil {
			t.Fatalf("round %d: %s (%v), request %d: %v", round, what, dst, i+1, err)
		}
		if !slices.Contains(want, b) {
			t.Fatalf("round %d: %s (%v), request %d: answered by %s, want one of %v", round, what, dst, i+1, b, want)
		}
	}
}

// expectNoAnswer requires a request from c1 to dst to reach no backend.
func expectNoAnswer(t *testing.T, e *Env, round int, what string, dst netip.AddrPort) {
	t.Helper()
	if b, err := e.Request("c1", dst, time.Second); err == nil {
		t.Fatalf("round %d: %s (%v): answered by %s, want no backend", round, what, dst, b)
	}
}
