package server_test

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/dataplane/fake"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// culpritOf is what a refusal must say of one listed service:
// "index service field", as client.Culprits reads it.
func culpritOf(c client.Culprit) string { return fmt.Sprintf("%d %s %s", c.Index, c.Service, c.Field) }

// errorInfo returns err's google.rpc.ErrorInfo, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

// TestSyncRefusalsNameTheCulprits: a SyncServices or SyncServicesStream
// refused with FailedPrecondition, AlreadyExists or ResourceExhausted
// because of listed services names each of them (BadRequest field
// services[i]..., ErrorInfo domain vipd.io with the reason, the first
// one's service, index and field, the other service or owner, and every
// culprit's name), keeps its message, and changes nothing; a full kernel
// table names no service.
func TestSyncRefusalsNameTheCulprits(t *testing.T) {
	noSCTPNoExternal := dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom, dataplane.LoadBalancingMaglev},
		Protocols:     []dataplane.Protocol{dataplane.TCP, dataplane.UDP},
	}
	sctp := func(name, vip string) *vipdv1.Service {
		s := web(name, vip)
		s.Ports[0].Protocol = vipdv1.Protocol_PROTOCOL_SCTP
		return s
	}
	tests := []struct {
		name     string
		caps     *dataplane.Capabilities
		limits   validation.Limits
		stored   []*vipdv1.Service // stored before, each with its owner
		failNext error             // the dataplane's next Apply fails with it
		list     []*vipdv1.Service // synced for owner k8s
		// chunks, when set, sends the list as a stream of chunks of these sizes.
		chunks   []int
		code     codes.Code
		message  []string // in the message, as before culprits were named
		reason   string
		culprits []string // culpritOf each, in order
		meta     map[string]string
	}{{
		name:     "names of another owner",
		stored:   []*vipdv1.Service{owned("nomad", "k8s/web", "198.19.0.1"), owned("nomad", "k8s/api", "198.19.0.2")},
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.10"), web("k8s/web", "198.19.0.1"), web("k8s/b", "198.19.0.11"), web("k8s/api", "198.19.0.2")},
		code:     codes.AlreadyExists,
		message:  []string{"service k8s/web belongs to owner nomad", "does not take it over"},
		reason:   client.ReasonServiceOwnedByOther,
		culprits: []string{"1 k8s/web services[1].name", "3 k8s/api services[3].name"},
		meta:     map[string]string{"service": "k8s/web", "index": "1", "field": "services[1].name", "owner": "nomad"},
	}, {
		name:     "VIP:ports of another owner's service",
		stored:   []*vipdv1.Service{owned("other", "other/z", "198.19.0.30")},
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.31"), web("k8s/b", "198.19.0.30"), web("k8s/c", "198.19.0.30")},
		code:     codes.AlreadyExists,
		message:  []string{"service k8s/b", "198.19.0.30:80/TCP", "service other/z"},
		reason:   client.ReasonServiceConflict,
		culprits: []string{"1 k8s/b services[1].vips[0]", "2 k8s/c services[2].vips[0]"},
		meta:     map[string]string{"service": "k8s/b", "index": "1", "field": "services[1].vips[0]", "other_service": "other/z"},
	}, {
		name:     "a VIP:port twice in the list",
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.50"), web("k8s/b", "198.19.0.50")},
		code:     codes.AlreadyExists,
		message:  []string{"service k8s/b", "service k8s/a"},
		reason:   client.ReasonServiceConflict,
		culprits: []string{"1 k8s/b services[1].vips[0]"},
		meta:     map[string]string{"other_service": "k8s/a", "other_index": "0"},
	}, {
		name: "a node port of another owner's service",
		stored: []*vipdv1.Service{func() *vipdv1.Service {
			s := external("lb", "198.19.0.40", "", "", 30080, 0)
			s.Owner = "other"
			return s
		}()},
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.41"), external("k8s/np", "198.19.0.42", "", "", 30080, 0)},
		code:     codes.AlreadyExists,
		message:  []string{"service k8s/np", "node port 30080/TCP", "service lb"},
		reason:   client.ReasonServiceConflict,
		culprits: []string{"1 k8s/np services[1].ports[0].node_port"},
		meta:     map[string]string{"other_service": "lb"},
	}, {
		name:     "over --max-services: the services that do not fit after those before them",
		limits:   validation.Limits{MaxServices: 2},
		stored:   []*vipdv1.Service{owned("other", "other/z", "198.19.0.30")},
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.31"), web("k8s/b", "198.19.0.32"), web("k8s/c", "198.19.0.33")},
		code:     codes.ResourceExhausted,
		message:  []string{"service k8s/b", "above the limit of 2 (--max-services)"},
		reason:   client.ReasonOverLimit,
		culprits: []string{"1 k8s/b services[1]", "2 k8s/c services[2]"},
		meta:     map[string]string{"resource": "services", "limit": "2", "flag": "--max-services"},
	}, {
		name:     "unsupported by the dataplane",
		caps:     &noSCTPNoExternal,
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.10"), sctp("k8s/s", "198.19.0.11"), external("k8s/np", "198.19.0.12", "", "", 30080, 0), external("k8s/ext", "198.19.0.13", "198.19.5.1", "", 0, 0)},
		code:     codes.FailedPrecondition,
		message:  []string{"service k8s/s", "protocol SCTP", "not supported by this dataplane"},
		reason:   client.ReasonUnsupportedByDataplane,
		culprits: []string{"1 k8s/s services[1].ports[0].protocol", "2 k8s/np services[2].ports[0].node_port", "3 k8s/ext services[3].external_ips[0]"},
		meta:     map[string]string{"feature": "protocol SCTP"},
	}, {
		name:     "unsupported when the dataplane applies it",
		failNext: &dataplane.UnsupportedError{Service: "k8s/b", Feature: "an SCTP target port"},
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.10"), web("k8s/b", "198.19.0.11")},
		code:     codes.FailedPrecondition,
		message:  []string{"service k8s/b", "an SCTP target port"},
		reason:   client.ReasonUnsupportedByDataplane,
		culprits: []string{"1 k8s/b services[1]"},
	}, {
		name:     "a full kernel table names no service",
		failNext: fmt.Errorf("%w: the backend map would need 9 entries and holds 8", dataplane.ErrResourceExhausted),
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.10", "198.18.1.1")},
		code:     codes.ResourceExhausted,
		message:  []string{"the backend map would need 9 entries", "the previous state stays in force"},
		reason:   client.ReasonDataplaneExhausted,
	}, {
		name:     "a stream counts services across its chunks",
		stored:   []*vipdv1.Service{owned("other", "other/z", "198.19.0.30")},
		list:     []*vipdv1.Service{web("k8s/a", "198.19.0.31"), web("k8s/b", "198.19.0.32"), web("k8s/c", "198.19.0.30")},
		chunks:   []int{2, 1},
		code:     codes.AlreadyExists,
		message:  []string{"service k8s/c", "service other/z"},
		reason:   client.ReasonServiceConflict,
		culprits: []string{"2 k8s/c services[2].vips[0]"},
		meta:     map[string]string{"index": "2", "other_service": "other/z"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dpOpts []fake.Option
			if tt.caps != nil {
				dpOpts = append(dpOpts, fake.WithCapabilities(*tt.caps))
			}
			dp := fake.New(dpOpts...)
			srv := testserver.Start(t, testserver.WithDataplane(dp), testserver.WithLimits(tt.limits))
			conn, err := grpc.NewClient(srv.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			in := &instance{dp: dp, lb: vipdv1.NewLoadBalancerServiceClient(conn)}
			// k8s/old is the owner's own, so that a sync that went through
			// would delete it.
			for _, s := range append(tt.stored, owned("k8s", "k8s/old", "198.19.0.99")) {
				upsert(t, in, s)
			}
			before, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			applied, gen := dp.Applied()
			if tt.failNext != nil {
				dp.FailNext(tt.failNext)
			}

			list := make([]*vipdv1.Service, len(tt.list))
			for i, s := range tt.list {
				list[i] = proto.CloneOf(s)
			}
			if tt.chunks == nil {
				_, err = in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "k8s", Services: list})
			} else {
				var chunks []*vipdv1.SyncServicesStreamRequest
				for _, n := range tt.chunks {
					chunks = append(chunks, chunkOf("k8s", list[:n]...))
					list = list[n:]
				}
				_, err = syncStream(ctxT(t), in, chunks...)
			}

			wantCode(t, err, tt.code, tt.message...)
			var got []string
			for _, c := range client.Culprits(err) {
				got = append(got, culpritOf(c))
				if c.Reason != tt.reason {
					t.Errorf("culprit %s: reason %q, want %q", culpritOf(c), c.Reason, tt.reason)
				}
				if !strings.Contains(c.Description, c.Service) {
					t.Errorf("culprit %s: description %q does not name it", culpritOf(c), c.Description)
				}
			}
			if !slices.Equal(got, tt.culprits) {
				t.Errorf("culprits:\n got %q\nwant %q", got, tt.culprits)
			}
			info := errorInfo(err)
			if info == nil || info.Domain != client.ErrorDomain || info.Reason != tt.reason || client.RefusalReason(err) != tt.reason {
				t.Fatalf("ErrorInfo %v; want domain %s, reason %s", info, client.ErrorDomain, tt.reason)
			}
			for k, v := range tt.meta {
				if info.Metadata[k] != v {
					t.Errorf("ErrorInfo metadata %s = %q, want %q (all: %v)", k, info.Metadata[k], v, info.Metadata)
				}
			}
			if len(tt.culprits) == 0 {
				if _, ok := info.Metadata["service"]; ok || len(client.Culprits(err)) > 0 {
					t.Errorf("a refusal of the whole request names a service: %v", info.Metadata)
				}
			} else {
				first := strings.Fields(tt.culprits[0])
				if info.Metadata["index"] != first[0] || info.Metadata["service"] != first[1] || info.Metadata["field"] != first[2] {
					t.Errorf("ErrorInfo names %v, want the first culprit %q", info.Metadata, tt.culprits[0])
				}
			}
			if tt.reason == client.ReasonOverLimit && !slices.ContainsFunc(status.Convert(err).Details(), func(d any) bool {
				_, ok := d.(*errdetails.QuotaFailure)
				return ok
			}) {
				t.Errorf("over-limit refusal without its QuotaFailure")
			}

			// Nothing changed: stored, applied, generation.
			after, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(before, after) {
				t.Errorf("services changed by a refused sync:\nbefore %v\nafter  %v", before, after)
			}
			appliedAfter, genAfter := dp.Applied()
			if genAfter != gen || !slices.Equal(slices.Sorted(maps.Keys(appliedAfter)), slices.Sorted(maps.Keys(applied))) {
				t.Errorf("dataplane changed by a refused sync: generation %d → %d", gen, genAfter)
			}
		})
	}
}

// TestSyncRefusalRetryWithoutCulprits: the list without the services a
// refusal names goes through in one more call, for each kind of refusal
// that names them.
func TestSyncRefusalRetryWithoutCulprits(t *testing.T) {
	srv := testserver.Start(t, testserver.WithLimits(validation.Limits{MaxServices: 4}))
	conn, err := grpc.NewClient(srv.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	in := &instance{dp: srv.Dataplane(), lb: vipdv1.NewLoadBalancerServiceClient(conn)}
	upsert(t, in, owned("other", "other/z", "198.19.0.30"))
	list := []*vipdv1.Service{
		web("k8s/a", "198.19.0.1"), web("k8s/b", "198.19.0.30"), web("k8s/c", "198.19.0.1"),
		web("k8s/d", "198.19.0.4"), web("k8s/e", "198.19.0.5"), web("k8s/f", "198.19.0.6"),
	}
	var refused []string
	for round := 0; ; round++ {
		if round > 3 {
			t.Fatalf("still refused after %d rounds; left out %v", round, refused)
		}
		send := make([]*vipdv1.Service, len(list))
		for i, s := range list {
			send[i] = proto.CloneOf(s)
		}
		_, err := in.lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "k8s", Services: send})
		if err == nil {
			break
		}
		cs := client.Culprits(err)
		if len(cs) == 0 {
			t.Fatalf("round %d: refused without culprits: %v", round, err)
		}
		drop := map[int]bool{}
		for _, c := range cs {
			drop[c.Index] = true
			refused = append(refused, c.Service+" "+c.Reason)
		}
		var kept []*vipdv1.Service
		for i, s := range list {
			if !drop[i] {
				kept = append(kept, s)
			}
		}
		list = kept
	}
	want := []string{"k8s/b " + client.ReasonServiceConflict, "k8s/c " + client.ReasonServiceConflict, "k8s/f " + client.ReasonOverLimit}
	if !slices.Equal(refused, want) {
		t.Fatalf("left out %q, want %q", refused, want)
	}
	if got := listed(t, in, "k8s"); !slices.Equal(got, []string{"k8s/a", "k8s/d", "k8s/e"}) {
		t.Fatalf("stored %v", got)
	}
}

// TestSyncRefusalNamesAtMost10000: a refusal names the first 10,000
// culprits (the details travel in a trailer of bounded size) and says how
// many there are; the list without them names the rest.
func TestSyncRefusalNamesAtMost10000(t *testing.T) {
	dp := fake.New(fake.WithCapabilities(dataplane.Capabilities{
		LoadBalancing: []dataplane.LoadBalancing{dataplane.LoadBalancingRandom},
		Protocols:     []dataplane.Protocol{dataplane.TCP},
	}))
	srv := testserver.Start(t, testserver.WithDataplane(dp))
	conn, err := grpc.NewClient(srv.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	lb := vipdv1.NewLoadBalancerServiceClient(conn)
	const n = 10002
	list := func(from int) []*vipdv1.Service {
		var out []*vipdv1.Service
		for i := from; i < n; i++ {
			s := web(fmt.Sprintf("k8s/s%d", i), fmt.Sprintf("198.19.%d.%d", i/250, i%250+1))
			s.Ports[0].Protocol = vipdv1.Protocol_PROTOCOL_UDP
			out = append(out, s)
		}
		return out
	}
	_, err = lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "k8s", Services: list(0)})
	cs := client.Culprits(err)
	if len(cs) != 10000 || cs[0].Index != 0 || cs[9999].Index != 9999 || cs[9999].Service != "k8s/s9999" {
		t.Fatalf("%d culprits (%v ... ); want services[0] to services[9999]", len(cs), cs[:min(len(cs), 1)])
	}
	if got := errorInfo(err).Metadata["culprits"]; got != strconv.Itoa(n) {
		t.Errorf("metadata culprits = %q, want %d", got, n)
	}
	_, err = lb.SyncServices(ctxT(t), &vipdv1.SyncServicesRequest{Owner: "k8s", Services: list(10000)})
	var got []string
	for _, c := range client.Culprits(err) {
		got = append(got, culpritOf(c))
	}
	if want := []string{"0 k8s/s10000 services[0].ports[0].protocol", "1 k8s/s10001 services[1].ports[0].protocol"}; !slices.Equal(got, want) {
		t.Errorf("the rest: %q, want %q", got, want)
	}
}
