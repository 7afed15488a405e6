package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// apiResult is what one dataplane's API benchmark measured: per-run call
// rates of UpsertService per number of clients, and of UpdateBackends.
type apiResult struct {
	upsert         map[int][]float64
	updateBackends []float64
}

// callLoop has clients goroutines call f(k, i) (client k, its i-th call)
// back to back for d and returns the successful calls per second.
func callLoop(clients int, d time.Duration, f func(k, i int) error) (float64, error) {
	var (
		ok    atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	start := time.Now()
	stop := start.Add(d)
	for k := range clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				if err := f(k, i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	return float64(ok.Load()) / time.Since(start).Seconds(), first
}

// apiThroughput measures vipd with dataplane dp and n services present.
func (b *bench) apiThroughput(ctx context.Context, dp string, n int) (res apiResult, err error) {
	lab, err := netlab.Build(ctx, netlab.Spec{}, nil)
	if err != nil {
		return res, err
	}
	defer lab.Close()
	d, err := newDaemon(b.vipd, b.vipdArgs, dp, lab.Node(1), b.work)
	if err != nil {
		return res, err
	}
	defer func() {
		if cerr := d.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if _, err := d.start(); err != nil {
		return res, err
	}
	if _, err := d.api.SyncServices(ctx, owner, fillers(n, 5)); err != nil {
		return res, fmt.Errorf("sync %d services: %w", n, err)
	}
	res.upsert = map[int][]float64{}
	for _, clients := range b.cfg.apiClients {
		for r := range b.cfg.apiRuns {
			b.logf("API: %s, UpsertService with %d clients, run %d/%d", dp, clients, r+1, b.cfg.apiRuns)
			rate, err := callLoop(clients, b.cfg.apiDuration, func(k, i int) error {
				// Client k moves its own service's backend around.
				svc := &vipdv1.Service{
					Name: fmt.Sprintf("%s/api%02d", owner, k), Owner: owner,
					Vips:     []string{fmt.Sprintf("198.19.254.%d", k+1)},
					Ports:    []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
					Backends: []*vipdv1.Backend{{Ip: fmt.Sprintf("198.18.127.%d", i%250+1)}},
				}
				_, err := d.api.UpsertService(ctx, svc, 0)
				return err
			})
			if err != nil {
				return res, fmt.Errorf("UpsertService: %w", err)
			}
			res.upsert[clients] = append(res.upsert[clients], rate)
		}
	}

	big := &vipdv1.Service{
		Name: owner + "/big", Owner: owner, Vips: []string{"198.19.254.200"},
		Ports: []*vipdv1.Port{{Port: 80, TargetPort: 8080}},
	}
	for i := range 1000 {
		big.Backends = append(big.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", 64+i/250, i%250+1)})
	}
	if _, err := d.api.UpsertService(ctx, big, 0); err != nil {
		return res, fmt.Errorf("upsert a service of 1,000 backends: %w", err)
	}
	for r := range b.cfg.apiRuns {
		b.logf("API: %s, UpdateBackends of 1,000 backends, run %d/%d", dp, r+1, b.cfg.apiRuns)
		rate, err := callLoop(1, b.cfg.apiDuration, func(_, i int) error {
			// Alternately add the 1,001st backend and remove it again.
			extra := "198.18.63.1"
			var err error
			if i%2 == 0 {
				_, err = d.api.UpdateBackends(ctx, big.Name, []*vipdv1.Backend{{Ip: extra}}, nil, 0)
			} else {
				_, err = d.api.UpdateBackends(ctx, big.Name, nil, []string{extra}, 0)
			}
			return err
		})
		if err != nil {
			return res, fmt.Errorf("UpdateBackends: %w", err)
		}
		res.updateBackends = append(res.updateBackends, rate)
	}
	return res, nil
}

// apiSection measures API throughput for both dataplanes.
func (b *bench) apiSection(ctx context.Context) (*table, error) {
	n := b.cfg.apiPresent
	t := &table{
		title: "5. API throughput",
		intro: fmt.Sprintf("Calls per second that return success, with %s services present (5 backends each), median (min–max) of %d runs of %v. "+
			"UpsertService: each client moves the backend of its own service back to back (vipd merges concurrent changes into one apply). "+
			"UpdateBackends: one client alternately adds and removes one backend of a service with 1,000 backends.", count(n), b.cfg.apiRuns, b.cfg.apiDuration),
		header: []string{"dataplane", "call", "clients", "calls/s"},
	}
	var firstErr error
	for _, dp := range []string{"ebpf", "iptables"} {
		res, err := b.apiThroughput(ctx, dp, n)
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("API throughput %s: %w", dp, err)
			}
			t.add(dp, "error: "+oneLine(err))
			continue
		}
		for _, c := range b.cfg.apiClients {
			t.add(dp, "UpsertService", fmt.Sprint(c), spreadOf(res.upsert[c]).format(fmtRate))
		}
		t.add(dp, "UpdateBackends (1,000 backends)", "1", spreadOf(res.updateBackends).format(fmtRate))
	}
	return t, firstErr
}
