package kubeadapter_test

import (
	"context"
	"sync"
	"testing"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeadapter"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// racer is vipd as the adapter sees it, with another writer that creates a
// service just after the adapter read its name as free: GetService of an
// armed name that answers NotFound first upserts the armed service, then
// returns the NotFound.
type racer struct {
	*client.Client
	t *testing.T

	mu    sync.Mutex
	armed map[string]*vipdv1.Service
	took  map[string]*vipdv1.Service // what the other writer created, as stored
}

func (r *racer) arm(svc *vipdv1.Service) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed[svc.Name] = svc
}

func (r *racer) GetService(ctx context.Context, name string) (*vipdv1.Service, error) {
	got, err := r.Client.GetService(ctx, name)
	if !client.IsNotFound(err) {
		return got, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if svc, ok := r.armed[name]; ok {
		delete(r.armed, name)
		stored, uerr := r.Client.UpsertService(ctx, svc, 0)
		if uerr != nil {
			r.t.Errorf("the other writer's upsert of %s: %v", name, uerr)
		}
		r.took[name] = stored
	}
	return got, err
}

// TestCreateDoesNotTakeOver: a name that another writer creates between
// the adapter's read (NotFound) and its write is never taken over. The
// adapter creates with create_only, so vipd refuses the create; the
// adapter reads the name again and leaves the Service out when another
// owner holds it, or updates it when it is kubernetes-owned (another
// adapter's). A create that vipd refuses for a VIP:port conflict is a
// conflict, not another owner's name.
func TestCreateDoesNotTakeOver(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// race arms r, prepares vipd and creates or changes the Service
		// shop/late of the VIP 198.19.0.31.
		race       func(t *testing.T, e *env, r *racer)
		want       string // shop/late in vipd's kubernetes services; "" absent
		leftOut    string // the reason it is left out for; "" none
		otherOwner bool   // the other writer's service must be unchanged
	}{{
		name: "another owner creates it between the read and the create",
		race: func(t *testing.T, e *env, r *racer) {
			r.arm(nomadService("shop/late", "198.19.0.30"))
			create(e, late())
		},
		leftOut:    kubeadapter.ReasonOtherOwner,
		otherOwner: true,
	}, {
		name: "the adapter's service is deleted, and another owner creates it between the reread and the create",
		race: func(t *testing.T, e *env, r *racer) {
			// The adapter creates it first; then it is deleted by hand,
			// and the next update of it meets the gap.
			create(e, late())
			e.settle()
			if err := e.vipd.DeleteService(ctx, "shop/late", 0); err != nil {
				t.Fatal(err)
			}
			r.arm(nomadService("shop/late", "198.19.0.30"))
			e.updateSlice(slice("shop", "late", "late-a", v4, ports(slicePort("", corev1.ProtocolTCP, 8080)), endpoint("198.18.1.5", ready, "")))
		},
		leftOut:    kubeadapter.ReasonOtherOwner,
		otherOwner: true,
	}, {
		name: "another adapter creates it under owner kubernetes: updated",
		race: func(t *testing.T, e *env, r *racer) {
			s := nomadService("shop/late", "198.19.0.30")
			s.Owner = "kubernetes"
			r.arm(s)
			create(e, late())
		},
		want: simpleSummary("198.19.0.31", "198.18.1.4"),
	}, {
		name: "its VIP:port is another owner's: a conflict",
		race: func(t *testing.T, e *env, r *racer) {
			if _, err := e.vipd.UpsertService(ctx, nomadService("nomad/db", "198.19.0.31"), 0); err != nil {
				t.Fatal(err)
			}
			create(e, late())
		},
		leftOut: kubeadapter.ReasonConflict,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, simple("shop", "web", "198.19.0.10", "198.18.1.1")...)
			r := &racer{t: t, armed: map[string]*vipdv1.Service{}, took: map[string]*vipdv1.Service{}}
			e.wrap = func(c *client.Client) kubeadapter.VIPD { r.Client = c; return r }
			a := e.start()
			e.settle()
			creates := e.calls.get(createOnly)
			tt.race(t, e, r)
			e.settle()
			want := map[string]string{"shop/web": simpleSummary("198.19.0.10", "198.18.1.1")}
			if tt.want != "" {
				want["shop/late"] = tt.want
			}
			if err := diffState(want, e.state()); err != nil {
				t.Fatal(err)
			}
			r.mu.Lock()
			armed, took := len(r.armed), r.took["shop/late"]
			r.mu.Unlock()
			if armed != 0 {
				t.Fatal("the adapter never read the name as free: the race was not run")
			}
			if tt.otherOwner {
				got, err := e.vipd.GetService(ctx, "shop/late")
				if err != nil || !proto.Equal(got, took) {
					t.Fatalf("the other owner's shop/late is now %v (%v); want it unchanged: %v", got, err, took)
				}
			}
			for _, reason := range []string{kubeadapter.ReasonOtherOwner, kubeadapter.ReasonConflict} {
				n := 0.0
				if reason == tt.leftOut {
					n = 1
				}
				waitMetric(t, a.reg, n, "vipd_k8s_services_left_out", "reason", reason)
			}
			if e.calls.get(createOnly) == creates {
				t.Error("the adapter made no create_only upsert")
			}
		})
	}
}

func late() []runtime.Object { return simple("shop", "late", "198.19.0.31", "198.18.1.4") }

// create adds the Services and slices of objs to the apiserver.
func create(e *env, objs []runtime.Object) {
	e.t.Helper()
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			e.createService(o)
		case *discoveryv1.EndpointSlice:
			e.createSlice(o)
		}
	}
}
