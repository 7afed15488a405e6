package kubeconvert_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vipd/vipd/internal/manifest"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestManifestExternal: "vipctl apply -f" of a LoadBalancer Service, as
// "kubectl get -o yaml" writes it (status included), gets its external
// half from the same conversion.
func TestManifestExternal(t *testing.T) {
	const doc = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 198.19.0.10
  clusterIPs: [198.19.0.10]
  externalIPs: [198.19.2.1]
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  loadBalancerSourceRanges: [198.18.0.0/16]
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}
status:
  loadBalancer:
    ingress:
    - {ip: 198.19.1.1, ipMode: VIP}
    - {ip: 198.19.1.2, ipMode: Proxy}
`
	svcs, err := manifest.Load(strings.NewReader(doc), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []*vipdv1.Service{{
		Name: "shop/web", Vips: []string{"198.19.0.10"},
		Ports:                    []*vipdv1.Port{{Name: "http", Protocol: tcp, Port: 80, TargetPort: 8080, NodePort: 30080}},
		Backends:                 []*vipdv1.Backend{},
		ExternalIps:              []string{"198.19.2.1"},
		LoadBalancerIps:          []string{"198.19.1.1"},
		LoadBalancerSourceRanges: []string{"198.18.0.0/16"},
		ExternalTrafficPolicy:    vipdv1.TrafficPolicy_TRAFFIC_POLICY_LOCAL,
		HealthCheckNodePort:      32000,
	}}
	if diff := cmp.Diff(want, svcs, protocmp.Transform()); diff != "" {
		t.Errorf("manifest.Load (-want +got):\n%s", diff)
	}
}
