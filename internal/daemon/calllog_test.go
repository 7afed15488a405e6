package daemon_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// callLines returns the log's lines about calls of method.
func callLines(log, method string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "vipd.grpc: call: method="+method+" ") {
			out = append(out, l)
		}
	}
	return out
}

// TestCallLog runs vipd at debug level and checks its log: each change
// is one info line with its caller (the uid and pid of a Unix-socket
// client, the certificate identity of an mTLS client), owner, service and
// outcome code; a read is one debug line and nothing at info level.
func TestCallLog(t *testing.T) {
	p := newPKI(t)
	cfg := config(t)
	cfg.Remote = p.remote(t, writeAuthz(t, testPolicy))
	r := startAt(t, hclog.Debug, cfg, healthpb.HealthCheckResponse_SERVING)
	a := p.dial(t, cfg.Remote.Listen, "a")
	local := r.local
	unixCaller := fmt.Sprintf("uid=%d pid=%d", os.Getuid(), os.Getpid())
	const mtlsCaller = "identity=spiffe://vipd.test/ctrl-a"

	if _, err := local.UpsertService(ctxT(t), svc("web", "team-a", "198.19.0.1", "198.18.0.1"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.UpdateBackends(ctxT(t), "web", []*vipdv1.Backend{{Ip: "198.18.0.2"}}, nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SyncServices(ctxT(t), "team-a", []*vipdv1.Service{svc("web", "", "198.19.0.1"), svc("api", "", "198.19.0.2")}); err != nil {
		t.Fatal(err)
	}
	bad := svc("bad", "team-a", "198.19.0.3")
	bad.Ports[0].Port = 70000
	if _, err := local.UpsertService(ctxT(t), bad, 0); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("invalid upsert: %v", err)
	}
	dry := &vipdv1.UpsertServiceRequest{Service: svc("dry", "team-a", "198.19.0.4"), ValidateOnly: true}
	if _, err := local.LoadBalancerClient().UpsertService(ctxT(t), dry); err != nil {
		t.Fatal(err)
	}
	// Without an owner, an upsert of a stored service keeps (and logs)
	// the stored owner, one of a new service the default; a SyncServices
	// without an owner is refused, and logged with the owner as given.
	keep := &vipdv1.UpsertServiceRequest{Service: svc("web", "", "198.19.0.1", "198.18.0.3")}
	if _, err := local.LoadBalancerClient().UpsertService(ctxT(t), keep); err != nil {
		t.Fatal(err)
	}
	fresh := &vipdv1.UpsertServiceRequest{Service: svc("fresh", "", "198.19.0.5"), ValidateOnly: true}
	if _, err := local.LoadBalancerClient().UpsertService(ctxT(t), fresh); err != nil {
		t.Fatal(err)
	}
	noOwner := &vipdv1.SyncServicesRequest{Services: []*vipdv1.Service{svc("web", "", "198.19.0.1")}}
	if _, err := local.LoadBalancerClient().SyncServices(ctxT(t), noOwner); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("SyncServices without an owner: %v", err)
	}
	if _, err := local.GetService(ctxT(t), "web"); err != nil {
		t.Fatal(err)
	}
	if err := local.DeleteService(ctxT(t), "api", 0); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	log := r.log.String()

	for _, tc := range []struct {
		method string
		want   [][]string // per line, in call order
	}{
		{"UpsertService", [][]string{
			{"[INFO]", unixCaller, "owner=team-a service=web", "code=OK"},
			{"[INFO]", unixCaller, "owner=team-a service=bad", "code=InvalidArgument"},
			{"[INFO]", unixCaller, "owner=team-a service=dry validate_only=true", "code=OK"},
			{"[INFO]", unixCaller, "owner=team-a service=web", "code=OK"},
			{"[INFO]", unixCaller, "owner=default service=fresh validate_only=true", "code=OK"},
		}},
		{"UpdateBackends", [][]string{{"[INFO]", mtlsCaller, "owner=team-a service=web", "code=OK"}}},
		{"SyncServices", [][]string{
			{"[INFO]", mtlsCaller, "owner=team-a services=2 names=[\"web\", \"api\"]", "code=OK"},
			{"[INFO]", unixCaller, `owner="" services=1 names=["web"]`, "code=InvalidArgument"},
		}},
		{"DeleteService", [][]string{{"[INFO]", unixCaller, "owner=team-a service=api", "code=OK"}}},
		{"GetService", [][]string{{"[DEBUG]", unixCaller, "code=OK"}}},
	} {
		lines := callLines(log, tc.method)
		if len(lines) != len(tc.want) {
			t.Errorf("%s: %d log lines, want %d:\n%s", tc.method, len(lines), len(tc.want), strings.Join(lines, "\n"))
			continue
		}
		for i, want := range tc.want {
			for _, w := range want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("%s call %d: log line lacks %q:\n%s", tc.method, i+1, w, lines[i])
				}
			}
		}
	}
	// At info level, reads leave no line.
	r2 := start(t, config(t), healthpb.HealthCheckResponse_SERVING)
	if _, err := r2.local.ListServices(ctxT(t), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := r2.local.Status(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	if lines := append(callLines(r2.log.String(), "ListServices"), callLines(r2.log.String(), "GetStatus")...); len(lines) > 0 {
		t.Errorf("reads logged at info level:\n%s", strings.Join(lines, "\n"))
	}
}
