package e2e

import (
	"context"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// writes counts the calls that change vipd's services, as vipd's own gRPC
// metrics see them.
func (e *env) writes() (full, partial float64) {
	e.t.Helper()
	m, err := e.node.VIPDMetrics()
	if err != nil {
		e.t.Fatal(err)
	}
	full = m.Sum("grpc_server_handled_total", `grpc_method="SyncServices"`) + m.Sum("grpc_server_handled_total", `grpc_method="SyncServicesStream"`)
	for _, method := range []string{"UpsertService", "DeleteService", "UpdateBackends"} {
		partial += m.Sum("grpc_server_handled_total", `grpc_method="`+method+`"`)
	}
	return full, partial
}

// TestAPIServerRestart stops the apiserver for 10 s and starts it again.
// Meanwhile vipd keeps serving what it had; afterwards the adapter resumes
// its watches without writing anything to vipd for the unchanged objects
// (no duplicate changes, at most one full sync rather than a storm), and
// a change made after the restart reaches vipd (none missed).
func TestAPIServerRestart(t *testing.T) {
	e := newEnv(t)
	e.createService(service("web", 80))
	pods := e.createPods(2, podSpec{app: "web", version: "v1", node: otherNode, ports: map[string]int32{"http": 8080}})
	before := []string{e.podIP(pods[0]) + " READY http=8080", e.podIP(pods[1]) + " READY http=8080"}
	e.waitVIPD("the Service before the restart", wantBackends("web", before...))
	// Let the adapter settle: the last pass done, nothing queued.
	time.Sleep(2 * time.Second)
	full0, partial0 := e.writes()

	if err := e.c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	if err := e.node.WaitHealthy(time.Second); err != nil {
		t.Logf("vipd-k8s /healthz with the apiserver down: %v", err)
	}
	e.waitVIPDWithin("vipd to keep its services while the apiserver is down", 5*time.Second, wantBackends("web", before...))
	if err := e.c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WaitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The informers re-watch (or re-list) within their backoff.
	time.Sleep(5 * time.Second)
	full1, partial1 := e.writes()
	t.Logf("across the apiserver restart vipd got %v full syncs and %v per-service calls", full1-full0, partial1-partial0)
	if partial1 != partial0 || full1 > full0+1 {
		t.Errorf("after the apiserver restart with nothing changed, vipd got %v per-service calls and %v full syncs; want none and at most one",
			partial1-partial0, full1-full0)
	}

	// A change after the restart arrives once.
	more := e.createPods(1, podSpec{app: "web", version: "v1", node: thisNode, ports: map[string]int32{"http": 8080}})
	e.waitVIPD("the pod added after the restart", wantBackends("web", append(before, e.podIP(more[0])+" READY http=8080 local")...))
	if err := e.node.WaitHealthy(10 * time.Second); err != nil {
		t.Error(err)
	}
}

// TestWatchExpiry compacts etcd and restarts the apiserver, so that its
// watch cache starts after the adapter's last resourceVersion: the
// adapter's watches fail with "too old resource version" and its
// informers re-list. Changes made meanwhile (while the adapter cannot
// watch) must reach vipd, including a deletion it never saw as an event.
func TestWatchExpiry(t *testing.T) {
	e := newEnv(t)
	e.createService(service("web", 80))
	e.createService(service("gone", 80))
	pods := e.createPods(2, podSpec{app: "web", version: "v1", node: otherNode, ports: map[string]int32{"http": 8080}})
	e.waitVIPD("both Services", func(m map[string]*vipdv1.Service) error {
		if err := wantBackends("web", e.podIP(pods[0])+" READY http=8080", e.podIP(pods[1])+" READY http=8080")(m); err != nil {
			return err
		}
		if _, ok := m[ns+"/gone"]; !ok {
			return fmt.Errorf("no shop/gone")
		}
		return nil
	})

	// The resourceVersion the adapter has seen at most, now.
	list, err := e.c.Admin.CoreV1().Services("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seenRV := list.ResourceVersion

	// Freeze the adapter: its watches fall behind while the cluster
	// changes, etcd compacts that history away, and the restarted
	// apiserver's watch cache begins after the adapter's resourceVersion.
	if err := e.node.Adapter.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			if err := e.node.Adapter.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(thaw)
	if err := e.c.Admin.CoreV1().Services(ns).Delete(e.ctx, "gone", deleteNow()); err != nil {
		t.Fatal(err)
	}
	e.remove(pods[:1])
	more := e.createPods(1, podSpec{app: "web", version: "v1", node: thisNode, ports: map[string]int32{"http": 8080}})
	e.createService(service("new", 80))
	rev, err := e.c.CompactEtcd(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd compacted to revision %d", rev)
	if err := e.c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := e.c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := e.c.WaitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	// A watch from what the adapter had seen is now expired: the adapter
	// cannot resume its watches and must re-list.
	if err := watchExpired(e, seenRV); err != nil {
		t.Fatal(err)
	}
	thaw()

	e.waitVIPD("the changes made while the adapter's watches expired", func(m map[string]*vipdv1.Service) error {
		if err := wantBackends("web", e.podIP(pods[1])+" READY http=8080", e.podIP(more[0])+" READY http=8080 local")(m); err != nil {
			return err
		}
		if _, ok := m[ns+"/gone"]; ok {
			return fmt.Errorf("shop/gone, deleted while the adapter was behind, is still in vipd")
		}
		if _, ok := m[ns+"/new"]; !ok {
			return fmt.Errorf("no shop/new")
		}
		return nil
	})
	if err := e.node.WaitHealthy(30 * time.Second); err != nil {
		t.Error(err)
	}
}

// watchExpired checks that a watch of Services from resourceVersion rv
// fails with 410 Gone (too old resource version).
func watchExpired(e *env, rv string) error {
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	w, err := e.c.Admin.CoreV1().Services("").Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return nil
		}
		return fmt.Errorf("watch from resourceVersion %s: %w; want 410 Gone", rv, err)
	}
	defer w.Stop()
	ev, ok := <-w.ResultChan()
	switch {
	case !ok:
		return fmt.Errorf("watch from resourceVersion %s ended without an event; want 410 Gone", rv)
	case ev.Type != watch.Error:
		return fmt.Errorf("watch from resourceVersion %s delivered a %s event: its window still reaches back there; want 410 Gone", rv, ev.Type)
	}
	if st, ok := ev.Object.(*metav1.Status); ok && st.Code == http.StatusGone {
		return nil
	}
	return fmt.Errorf("watch from resourceVersion %s: error event %v; want 410 Gone", rv, ev.Object)
}

// TestEtcdRestart stops etcd for 10 s under a running apiserver: the
// adapter keeps vipd as it was, and a change made once etcd is back
// reaches vipd.
func TestEtcdRestart(t *testing.T) {
	e := newEnv(t)
	e.createService(service("web", 80))
	pods := e.createPods(1, podSpec{app: "web", version: "v1", node: otherNode, ports: map[string]int32{"http": 8080}})
	first := e.podIP(pods[0]) + " READY http=8080"
	e.waitVIPD("the Service before the restart", wantBackends("web", first))
	if err := e.c.RestartEtcd(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	e.waitVIPDWithin("vipd to keep its services", 5*time.Second, wantBackends("web", first))
	if err := e.c.WaitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	more := e.createPods(1, podSpec{app: "web", version: "v1", node: thisNode, ports: map[string]int32{"http": 8080}})
	e.waitVIPD("the pod added after etcd's restart", wantBackends("web", first, e.podIP(more[0])+" READY http=8080 local"))
	if err := e.node.WaitHealthy(30 * time.Second); err != nil {
		t.Error(err)
	}
}

// TestVIPDRestartWithoutState restarts vipd with its state directory
// emptied: the adapter notices vipd's health stream break and full-syncs,
// so vipd has the cluster's Services again without any Kubernetes change.
func TestVIPDRestartWithoutState(t *testing.T) {
	testVIPDRestarts(t, 60*time.Second, true)
}

// TestVIPDRestartedTwice restarts vipd twice in quick succession, the
// second time with its state directory emptied, inside the adapter's
// reconnect wait: the adapter must tell the second instance from the
// first (vipd's instance ID) and full-sync it, as the bug report
// found it did not.
func TestVIPDRestartedTwice(t *testing.T) {
	testVIPDRestarts(t, 30*time.Second, false, true)
}

// testVIPDRestarts restarts vipd once per wipes entry, back to back (with
// its state directory emptied where the entry is true), and checks that
// the adapter refills vipd within refill and reports healthy again.
func testVIPDRestarts(t *testing.T, refill time.Duration, wipes ...bool) {
	e := newEnv(t)
	e.createService(service("web", 80))
	pods := e.createPods(1, podSpec{app: "web", version: "v1", node: otherNode, ports: map[string]int32{"http": 8080}})
	first := e.podIP(pods[0]) + " READY http=8080"
	e.waitVIPD("the Service before the restarts", wantBackends("web", first))
	for _, wipe := range wipes {
		if err := e.node.RestartVIPD(e.ctx, wipe); err != nil {
			t.Fatal(err)
		}
	}
	e.waitVIPDWithin("the adapter to refill vipd", refill, wantBackends("web", first))
	if err := e.node.WaitHealthy(30 * time.Second); err != nil {
		t.Error(err)
	}
}
