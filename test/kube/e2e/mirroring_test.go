package e2e

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEndpointsMirrored: a Service without a selector and an Endpoints
// object written by hand (as an external controller would) reach vipd
// through the EndpointSliceMirroring controller's slices (Endpoints is
// deprecated for readers, not for this: mirroring is what keeps such
// Services working).
func TestEndpointsMirrored(t *testing.T) {
	e := newEnv(t)
	svc := service("ext", 80)
	svc.Spec.Selector = nil
	svc.Spec.Ports[0].TargetPort.StrVal, svc.Spec.Ports[0].TargetPort.Type = "", 0
	svc.Spec.Ports[0].TargetPort.IntVal = 8443
	e.createService(svc)
	eps := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: ns},
		Subsets: []corev1.EndpointSubset{{
			Addresses:         []corev1.EndpointAddress{{IP: "198.18.200.1"}, {IP: "198.18.200.2"}},
			NotReadyAddresses: []corev1.EndpointAddress{{IP: "198.18.200.3"}},
			Ports:             []corev1.EndpointPort{{Name: "http", Port: 8443, Protocol: corev1.ProtocolTCP}},
		}},
	}
	if _, err := e.c.Admin.CoreV1().Endpoints(ns).Create(e.ctx, eps, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitVIPD("the mirrored endpoints", wantBackends("ext",
		"198.18.200.1 READY http=8443",
		"198.18.200.2 READY http=8443",
		"198.18.200.3 NOT_SERVING http=8443",
	))
}
