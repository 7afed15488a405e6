package kubeconvert_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

// TestConvertTrafficDistribution: spec.trafficDistribution maps to the
// enum, PreferClose being PreferSameZone's old name; an unknown value is
// no preference.
func TestConvertTrafficDistribution(t *testing.T) {
	for in, want := range map[string]vipdv1.TrafficDistribution{
		"":               vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_UNSPECIFIED,
		"PreferClose":    vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE,
		"PreferSameZone": vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_ZONE,
		"PreferSameNode": vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_PREFER_SAME_NODE,
		"PreferFarAway":  vipdv1.TrafficDistribution_TRAFFIC_DISTRIBUTION_UNSPECIFIED,
	} {
		s := service([]string{"198.19.0.1"}, svcPort("http", corev1.ProtocolTCP, 80, intstr.FromInt32(8080)))
		if in != "" {
			s.Spec.TrafficDistribution = ptr.To(in)
		}
		got, err := kubeconvert.Convert(s, nil, kubeconvert.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got.TrafficDistribution != want {
			t.Errorf("trafficDistribution %q: %v, want %v", in, got.TrafficDistribution, want)
		}
	}
}

func hinted(ip, zone string, zones, nodes []string) discoveryv1.Endpoint {
	ep := endpoint(ip, isReady, "")
	ep.Zone = ptr.To(zone)
	ep.Hints = &discoveryv1.EndpointHints{}
	for _, z := range zones {
		ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
	}
	for _, n := range nodes {
		ep.Hints.ForNodes = append(ep.Hints.ForNodes, discoveryv1.ForNode{Name: n})
	}
	return ep
}

// TestConvertHints: each endpoint's zone and hints reach the backend,
// sorted; a listing in a second slice completes what the first lacks; a
// hint list vipd would refuse is left out whole, so that the service is
// still admitted.
func TestConvertHints(t *testing.T) {
	http := []discoveryv1.EndpointPort{slicePort("http", corev1.ProtocolTCP, 8080)}
	ports := map[string]uint32{"http": 8080}
	tooMany := strings.Split("a,b,c,d,e,f,g,h,i", ",")
	tests := []struct {
		name string
		eps  []discoveryv1.Endpoint
		more []discoveryv1.Endpoint // in a second slice
		want []*vipdv1.Backend
	}{{
		name: "zone and hints copied, sorted",
		eps:  []discoveryv1.Endpoint{hinted("198.18.1.1", "zone-a", []string{"zone-b", "zone-a"}, []string{"node-2", "node-1"})},
		want: []*vipdv1.Backend{{Ip: "198.18.1.1", State: ready, OnlyNamedPorts: true, Ports: ports, Zone: "zone-a",
			ForZones: []string{"zone-a", "zone-b"}, ForNodes: []string{"node-1", "node-2"}}},
	}, {
		name: "no hints",
		eps:  []discoveryv1.Endpoint{hinted("198.18.1.1", "zone-a", nil, nil)},
		want: []*vipdv1.Backend{{Ip: "198.18.1.1", State: ready, OnlyNamedPorts: true, Ports: ports, Zone: "zone-a"}},
	}, {
		name: "a second listing completes the first",
		eps:  []discoveryv1.Endpoint{hinted("198.18.1.1", "", nil, []string{"node-1"})},
		more: []discoveryv1.Endpoint{hinted("198.18.1.1", "zone-a", []string{"zone-a"}, []string{"node-9"})},
		want: []*vipdv1.Backend{{Ip: "198.18.1.1", State: ready, OnlyNamedPorts: true, Ports: ports, Zone: "zone-a",
			ForZones: []string{"zone-a"}, ForNodes: []string{"node-1"}}},
	}, {
		name: "refusable hints left out",
		eps: []discoveryv1.Endpoint{
			hinted("198.18.1.1", "zone-a", tooMany, []string{"node-1", "node-1"}),
			hinted("198.18.1.2", "zone-a", []string{""}, []string{strings.Repeat("n", 254)}),
		},
		want: []*vipdv1.Backend{
			{Ip: "198.18.1.1", State: ready, OnlyNamedPorts: true, Ports: ports, Zone: "zone-a"},
			{Ip: "198.18.1.2", State: ready, OnlyNamedPorts: true, Ports: map[string]uint32{"http": 8080}, Zone: "zone-a"},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := service([]string{"198.19.0.1"}, svcPort("http", corev1.ProtocolTCP, 80, intstr.FromString("http")))
			s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
			sl := []*discoveryv1.EndpointSlice{slice("web-a", discoveryv1.AddressTypeIPv4, http, tt.eps...)}
			if tt.more != nil {
				sl = append(sl, slice("web-b", discoveryv1.AddressTypeIPv4, http, tt.more...))
			}
			got, err := kubeconvert.Convert(s, sl, kubeconvert.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got.Backends, protocmp.Transform()); diff != "" {
				t.Errorf("backends (-want +got):\n%s", diff)
			}
			if _, _, v := validation.Service(got, validation.Limits{}, "service"); v != nil {
				t.Errorf("vipd refuses the converted service: %v", v)
			}
		})
	}
}
