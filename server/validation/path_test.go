package validation_test

import (
	"testing"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/validation"
)

func TestResolvePath(t *testing.T) {
	req := &vipdv1.UpsertServiceRequest{Service: &vipdv1.Service{
		Name:  "default/web",
		Vips:  []string{"10.96.0.10", "x"},
		Ports: []*vipdv1.Port{{Name: "http", Port: 80}},
		Backends: []*vipdv1.Backend{
			{Ip: "10.0.0.1", Ports: map[string]uint32{"http": 8080, `we"ird`: 1}},
		},
		Labels: map[string]string{"app": "web", "": "empty key"},
	}}
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"service", true},
		{"expected_generation", true},
		{"service.name", true},
		{"service.vips", true},
		{"service.vips[0]", true},
		{"service.vips[1]", true},
		{"service.vips[2]", false},
		{"service.vips[-1]", false},
		{"service.vips[01]", false},
		{"service.vips[+1]", false},
		{"service.vips[]", false},
		{"service.vips[0", false},
		{"service.vips[0].x", false},
		{"service.ports[0].port", true},
		{"service.ports[0].target_port", true},
		{"service.ports[0].targetPort", false},
		{"service.ports[1]", false},
		{"service.backends[0].ip", true},
		{`service.backends[0].ports["http"]`, true},
		{`service.backends[0].ports["we\"ird"]`, true},
		{`service.backends[0].ports["https"]`, false},
		{`service.backends[0].ports[http]`, false},
		{`service.backends[0].ports["http"`, false},
		{`service.backends[0].ports["http"].x`, false},
		{`service.labels["app"]`, true},
		{`service.labels[""]`, true},
		{`service.labels["tier"]`, false},
		{"service.labels", true},
		{"service.session_affinity.timeout_seconds", true}, // unset messages are walked as empty ones
		{"service.session_affinity.nope", false},
		{"service.session_affinity.", false},
		{"service..name", false},
		{".service", false},
		{"", false},
		{"services[0]", false},
		{"service.name.x", false},
		{"service.name[0]", false},
		{"service name", false},
	} {
		err := validation.ResolvePath(req, tc.path)
		if (err == nil) != tc.ok {
			t.Errorf("ResolvePath(%q) = %v, want ok %v", tc.path, err, tc.ok)
		}
	}
	// A nil service still has its fields, but no elements.
	empty := &vipdv1.UpsertServiceRequest{}
	for path, ok := range map[string]bool{"service": true, "service.name": true, "service.vips": true, "service.vips[0]": false} {
		if err := validation.ResolvePath(empty, path); (err == nil) != ok {
			t.Errorf("ResolvePath(empty, %q) = %v, want ok %v", path, err, ok)
		}
	}
}
