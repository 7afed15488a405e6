package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// scaleServices is how many Services TestScale creates (10 pods each):
// 1,000 unless VIPD_KUBE_SCALE_SERVICES says otherwise.
func scaleServices(t *testing.T) int {
	if v := os.Getenv("VIPD_KUBE_SCALE_SERVICES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("VIPD_KUBE_SCALE_SERVICES=%q: want a positive number", v)
		}
		return n
	}
	return 1000
}

// TestScale creates N Services with 10 pods each (pods made Ready as they
// are created, 8 requests at a time) and waits until vipd has every
// Service with its 10 backends. It reports the time from the first
// creation to vipd having everything, and vipd-k8s's resident memory.
func TestScale(t *testing.T) {
	const podsPer = 10
	n := scaleServices(t)
	e := newEnv(t)
	start := time.Now()
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()

	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	work := make(chan func() error)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				if err := f(); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
				}
			}
		}()
	}
	for i := range n {
		name := fmt.Sprintf("s%04d", i)
		work <- func() error {
			_, err := e.c.Admin.CoreV1().Services(ns).Create(ctx, service(name, 80), createOpts)
			return err
		}
		for range podsPer {
			work <- func() error {
				_, err := e.createPod(ctx, podSpec{app: name, version: "v1", node: otherNode, ports: map[string]int32{"http": 8080}})
				return err
			}
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	created := time.Since(start)
	t.Logf("created %d Services and %d pods in %v", n, n*podsPer, created.Round(time.Millisecond))

	e.waitVIPDWithin(fmt.Sprintf("%d Services with %d backends each", n, podsPer), 15*time.Minute, func(m map[string]*vipdv1.Service) error {
		missing, short := 0, 0
		for i := range n {
			svc, ok := m[fmt.Sprintf("%s/s%04d", ns, i)]
			switch {
			case !ok:
				missing++
			case len(svc.GetBackends()) != podsPer:
				short++
			}
		}
		if missing+short > 0 {
			return fmt.Errorf("%d Services missing, %d without all %d backends", missing, short, podsPer)
		}
		return nil
	})
	total := time.Since(start)
	rss, hwm := memory(t, e.node.Adapter.Pid())
	t.Logf("SCALE services=%d pods=%d create=%v converged=%v (after the last creation: %v) vipd-k8s RSS=%d KiB peak=%d KiB",
		n, n*podsPer, created.Round(time.Millisecond), total.Round(time.Millisecond), (total - created).Round(time.Millisecond), rss, hwm)
}

// memory reads a process's resident set size and its peak, in KiB.
func memory(t *testing.T, pid int) (rss, peak int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.Atoi(fields[1])
		switch fields[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			peak = v
		}
	}
	return rss, peak
}
