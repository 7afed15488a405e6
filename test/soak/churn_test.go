package soak

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// TestBackendChurnUnderLoad replaces the backend set of a service 10 times
// a second while about 500 new connections a second run through its VIP
// from two client pods. be1 and be2 stay READY throughout; be3 to be6 come
// and go, READY, TERMINATING or NOT_SERVING at random. Every backend's
// echo server stays up, so no new connection may fail, whichever backend
// it reached. Established connections, opened before the churn to every
// backend, must keep working, on the same backend, whatever happens to it:
// the conformance suite's rule for removed, terminating and not-serving
// backends ("terminating-and-not-serving").
//
// Short form: 6 s. Full form: 30 s.
func TestBackendChurnUnderLoad(t *testing.T) {
	forEachDataplane(t, testBackendChurn)
}

const (
	churnRate     = 10  // backend-set replacements a second
	churnConnRate = 500 // new connections a second
)

func testBackendChurn(t *testing.T, dp string) {
	rng := newRand(t)
	duration := Pick(6*time.Second, 30*time.Second)
	names := []string{"be1", "be2", "be3", "be4", "be5", "be6"}
	e := NewEnv(t, vipdBin, dp, Spec{Clients: []string{"c1", "c2"}, Backends: names})
	vip := ap(VIP(0x201), 80)
	pods := map[string]*netlab.Pod{}
	for _, n := range names {
		pods[n] = e.Pod(n)
	}
	set := func(churners map[string]vipdv1.BackendState) *vipdv1.Service {
		svc := service("soak/churn", "soak", vip.Addr(), backend(pods["be1"]), backend(pods["be2"]))
		for _, n := range names[2:] {
			if st, ok := churners[n]; ok {
				svc.Backends = append(svc.Backends, &vipdv1.Backend{Ip: pods[n].IPv4().String(), State: st, Weight: uint32(rng.IntN(3) + 1)})
			}
		}
		return svc
	}
	ready := vipdv1.BackendState_BACKEND_STATE_READY
	e.Upsert(set(map[string]vipdv1.BackendState{"be3": ready, "be4": ready, "be5": ready, "be6": ready}))

	// Established connections, until every backend has some.
	type held struct {
		c       *netlab.Conn
		backend string
	}
	var conns []held
	seen := map[string]int{}
	for i := 0; i < 200 && (len(seen) < len(names) || len(conns) < 12); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		c, err := e.Pod("c1").Dial(ctx, "tcp", vip.String())
		if err != nil {
			cancel()
			t.Fatalf("dial %v: %v", vip, err)
		}
		r, err := c.Request(ctx)
		cancel()
		if err != nil {
			c.Close()
			t.Fatalf("first request on a connection to %v: %v", vip, err)
		}
		if seen[r.Backend] >= 3 {
			c.Close()
			continue
		}
		seen[r.Backend]++
		conns = append(conns, held{c, r.Backend})
	}
	defer func() {
		for _, h := range conns {
			h.c.Close()
		}
	}()
	if len(seen) < len(names) {
		t.Fatalf("200 connections reached only %v", seen)
	}

	target := Target{Addr: vip, Backends: names}
	cfg := TrafficConfig{Workers: 12, Rate: churnConnRate / 2}
	t1 := StartTraffic(e.Pod("c1").NS, cfg, target)
	defer t1.Stop()
	t2 := StartTraffic(e.Pod("c2").NS, cfg, target)
	defer t2.Stop()

	// The established connections, probed all along.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var connErrs []string
	probes := 0
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			for i, h := range conns {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				r, err := h.c.Request(ctx)
				cancel()
				mu.Lock()
				probes++
				switch {
				case err != nil:
					connErrs = append(connErrs, fmt.Sprintf("%s: connection %d to %s: %v", time.Now().Format("15:04:05.000"), i, h.backend, err))
				case r.Backend != h.backend:
					connErrs = append(connErrs, fmt.Sprintf("connection %d moved from %s to %s", i, h.backend, r.Backend))
				}
				mu.Unlock()
			}
		}
	}()

	api := e.NewClient()
	states := []vipdv1.BackendState{ready, ready, vipdv1.BackendState_BACKEND_STATE_TERMINATING, vipdv1.BackendState_BACKEND_STATE_NOT_SERVING}
	replacements := 0
	start := time.Now()
	tick := time.NewTicker(time.Second / churnRate)
	for time.Since(start) < duration {
		<-tick.C
		churners := map[string]vipdv1.BackendState{}
		for _, n := range names[2:] {
			if rng.IntN(2) == 0 {
				churners[n] = states[rng.IntN(len(states))]
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := api.UpsertService(ctx, set(churners), 0)
		cancel()
		if err != nil {
			t.Fatalf("replacement %d of the backend set: %v", replacements+1, err)
		}
		replacements++
	}
	tick.Stop()
	elapsed := time.Since(start)
	s1, s2 := t1.Stop(), t2.Stop()
	close(stop)
	wg.Wait()

	if err := e.CheckKernel(); err != nil {
		t.Errorf("after the churn: %v", err)
	}
	total := s1.OK + s1.Failed + s2.OK + s2.Failed
	rate := float64(total) / s1.Elapsed.Seconds()
	t.Logf("%s: %s", dp, summary("replacements", replacements, "replacements_per_s", fmt.Sprintf("%.1f", float64(replacements)/elapsed.Seconds()),
		"new_connections", total, "new_connections_per_s", fmt.Sprintf("%.0f", rate), "failed", s1.Failed+s2.Failed,
		"established_connections", len(conns), "established_probes", probes, "established_failures", len(connErrs)))
	t.Logf("%s: c1: %v", dp, s1)
	t.Logf("%s: c2: %v", dp, s2)
	if s1.Failed+s2.Failed > 0 {
		t.Errorf("new connections failed during the churn (every backend stayed up): c1 %v; c2 %v", s1, s2)
	}
	if len(connErrs) > 0 {
		t.Errorf("%d of %d requests on established connections failed or moved; first: %v", len(connErrs), probes, connErrs[:min(5, len(connErrs))])
	}
	// The rates are targets: on a busy machine an apply or a connection
	// takes longer. Below half of them, the test would not show what it is
	// about.
	if float64(replacements) < 0.5*churnRate*elapsed.Seconds() {
		t.Errorf("only %d backend-set replacements in %v, want about %d a second", replacements, elapsed.Round(time.Millisecond), churnRate)
	}
	if rate < 0.5*churnConnRate {
		t.Errorf("only %.0f new connections a second, want about %d", rate, churnConnRate)
	}
	for _, n := range names {
		if s1.Backends[n]+s2.Backends[n] == 0 {
			t.Errorf("no new connection reached %s", n)
		}
	}
}
