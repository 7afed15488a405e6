package cli

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/syncbuf"

	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/flowhub"
)

const flowServices = `
name: default/web
vips: [10.96.0.10, fd00:96::10]
ports:
- {name: http, port: 80, target_port: 8080}
- {name: dns, protocol: udp, port: 53}
backends:
- {ip: 10.0.1.5, weight: 1}
- {ip: 10.0.1.6, weight: 3, ports: {http: 9090}}
- {ip: 10.0.1.7, state: not_serving}
- {ip: fd00::5}
`

var flowT0 = time.Date(2026, 1, 2, 3, 4, 5, 250e6, time.UTC)

// webFlows are two live flows of default/web and one through a VIP that
// no service claims.
func webFlows() []dataplane.Flow {
	return []dataplane.Flow{
		{ID: 7, Protocol: dataplane.TCP, Client: netip.MustParseAddrPort("10.0.0.9:43512"), VIP: netip.MustParseAddrPort("10.96.0.10:80"),
			Backend: netip.MustParseAddrPort("10.0.1.6:9090"), Start: flowT0,
			OrigPackets: 5, OrigBytes: 420, ReplyPackets: 4, ReplyBytes: 1800, TCPState: dataplane.TCPEstablished},
		{ID: 8, Protocol: dataplane.UDP, Client: netip.MustParseAddrPort("[fd00::9]:5353"), VIP: netip.MustParseAddrPort("[fd00:96::10]:53"),
			Backend: netip.MustParseAddrPort("[fd00::5]:53"), Start: flowT0.Add(time.Second)},
		{ID: 9, Protocol: dataplane.TCP, Client: netip.MustParseAddrPort("10.0.0.10:40000"), VIP: netip.MustParseAddrPort("10.96.0.99:80"),
			Backend: netip.MustParseAddrPort("10.0.1.99:80"), Start: flowT0.Add(2 * time.Second), TCPState: dataplane.TCPSynSent},
	}
}

// withoutAge replaces the age of EXISTING flows, which depends on the
// clock, with AGE.
func withoutAge(s string) string {
	var out []string
	for _, line := range strings.SplitAfter(s, "\n") {
		if i := strings.Index(line, ", age "); i >= 0 {
			line = line[:i] + ", age AGE\n"
		}
		out = append(out, line)
	}
	return strings.Join(out, "")
}

func TestFlowsList(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "svc.yaml", flowServices)).checkCode(t, ExitOK)
	vipd.Dataplane().SetFlows(webFlows(), nil)

	r := vipctl(t, sock, "", "flows")
	r.stdout = withoutAge(r.stdout)
	r.check(t, `2026-01-02T03:04:05.250Z  EXISTING  TCP   10.0.0.9:43512 → 10.96.0.10:80 → 10.0.1.6:9090  default/web:http  ESTABLISHED  client→backend 5 pkts 420 B, backend→client 4 pkts 1800 B, age AGE
2026-01-02T03:04:06.250Z  EXISTING  UDP   [fd00::9]:5353 → [fd00:96::10]:53 → [fd00::5]:53  default/web:dns  -  client→backend 0 pkts 0 B, backend→client 0 pkts 0 B, age AGE
2026-01-02T03:04:07.250Z  EXISTING  TCP   10.0.0.10:40000 → 10.96.0.99:80 → 10.0.1.99:80  -  SYN_SENT  client→backend 0 pkts 0 B, backend→client 0 pkts 0 B, age AGE
`, "", ExitOK)

	r = vipctl(t, sock, "", "flows", "--service", "default/web", "--protocol", "udp", "-o", "json")
	if r.code != ExitOK || strings.Count(r.stdout, "\n") != 1 ||
		!strings.HasPrefix(r.stdout, `{"flow":{"type":"FLOW_EVENT_TYPE_EXISTING","time":"`) ||
		!strings.Contains(r.stdout, `"service":"default/web","portName":"dns","protocol":"PROTOCOL_UDP","client":{"ip":"fd00::9","port":5353},"vip":{"ip":"fd00:96::10","port":53},"backend":{"ip":"fd00::5","port":53},`) ||
		!strings.Contains(r.stdout, `"flowId":"8","start":"2026-01-02T03:04:06.250Z"}}`) {
		t.Errorf("flows -o json: code %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout, "tcpState") {
		t.Errorf("flows -o json of a UDP flow carries a TCP state:\n%s", r.stdout)
	}
	r = vipctl(t, sock, "", "flows", "--vip", "10.96.0.10", "-o", "json")
	if r.code != ExitOK || strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, `"tcpState":"TCP_STATE_ESTABLISHED"`) {
		t.Errorf("flows -o json of an established TCP flow: code %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	r = vipctl(t, sock, "", "flows", "--client", "10.0.0.0/24", "--vip", "10.96.0.10:80", "--backend", "10.0.1.6", "--limit", "5")
	if r.code != ExitOK || strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, " 10.0.0.9:43512 → ") {
		t.Errorf("flows with filters: code %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = vipctl(t, sock, "", "flows", "--limit", "1")
	if r.code != ExitOK || strings.Count(r.stdout, "\n") != 1 || r.stderr != "More flows matched than the 1 shown; see --limit.\n" {
		t.Errorf("flows --limit 1: code %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	vipctl(t, sock, "", "flows", "--client", "10.0.0.0/40").check(t, "", `Error: InvalidArgument: invalid request
  filter.client: "10.0.0.0/40" is not a CIDR such as 10.0.0.0/8
`, ExitInvalid)
}

// follow runs "vipctl flows --follow" with args until it has printed
// lines lines after emit ran, then interrupts it as Ctrl-C would. It must
// be the only stream of vipd.
func follow(t *testing.T, vipd *testserver.Server, lines int, emit func(), args ...string) result {
	t.Helper()
	var out, errb syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	app := New(Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
	done := make(chan int, 1)
	deadline := time.Now().Add(5 * time.Second)
	// vipd notices that the previous vipctl went away on its own time.
	for vipd.Flows().Subscribers() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d streams left over", vipd.Flows().Subscribers())
		}
		time.Sleep(time.Millisecond)
	}
	go func() {
		done <- app.Run(ctx, append([]string{"--socket", vipd.Socket(), "flows", "--follow"}, args...))
	}()
	for vipd.Flows().Subscribers() == 0 {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("vipctl flows --follow did not subscribe; stderr:\n%s", errb.String())
		}
		time.Sleep(time.Millisecond)
	}
	emit()
	for strings.Count(out.String(), "\n") < lines {
		if time.Now().After(deadline) {
			t.Errorf("vipctl flows --follow printed only:\n%s", out.String())
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	code := <-done
	return result{stdout: out.String(), stderr: errb.String(), code: code}
}

func TestFlowsFollow(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "svc.yaml", flowServices)).checkCode(t, ExitOK)
	dp := vipd.Dataplane()
	live := webFlows()
	closed := live[0]
	closed.Duration = 2500 * time.Millisecond
	closed.CloseReason = dataplane.CloseRST
	closed.TCPState = dataplane.TCPClose
	emit := func() {
		dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Time: flowT0, Flow: live[0]})
		dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Time: flowT0.Add(time.Second), Flow: live[1]})
		dp.Lose(3)
		dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Time: flowT0.Add(3 * time.Second), Flow: closed})
	}
	follow(t, vipd, 4, emit).check(t, `2026-01-02T03:04:05.250Z  NEW       TCP   10.0.0.9:43512 → 10.96.0.10:80 → 10.0.1.6:9090  default/web:http
2026-01-02T03:04:06.250Z  NEW       UDP   [fd00::9]:5353 → [fd00:96::10]:53 → [fd00::5]:53  default/web:dns
!! LOST 3 events (dropped by the kernel before vipd could read them)
2026-01-02T03:04:08.250Z  CLOSED    TCP   10.0.0.9:43512 → 10.96.0.10:80 → 10.0.1.6:9090  default/web:http  rst  client→backend 5 pkts 420 B, backend→client 4 pkts 1800 B, 2.5s
`, "", ExitOK)

	follow(t, vipd, 2, emit, "--types", "closed", "--protocol", "tcp", "-o", "json").check(t,
		`{"lost":{"count":"3","source":"LOST_EVENTS_SOURCE_KERNEL"}}
{"flow":{"type":"FLOW_EVENT_TYPE_CLOSED","time":"2026-01-02T03:04:08.250Z","service":"default/web","portName":"http","protocol":"PROTOCOL_TCP","client":{"ip":"10.0.0.9","port":43512},"vip":{"ip":"10.96.0.10","port":80},"backend":{"ip":"10.0.1.6","port":9090},"packetsToBackend":"5","bytesToBackend":"420","packetsToClient":"4","bytesToClient":"1800","duration":"2.500s","closeReason":"rst","flowId":"7","start":"2026-01-02T03:04:05.250Z","tcpState":"TCP_STATE_CLOSE"}}
`, "", ExitOK)

	// --existing lists first.
	dp.SetFlows(live, nil)
	r := follow(t, vipd, 2, func() {
		dp.Emit(dataplane.FlowEvent{Type: dataplane.FlowClosed, Time: flowT0.Add(3 * time.Second), Flow: closed})
	},
		"--existing", "--service", "default/web", "--protocol", "tcp")
	r.stdout = withoutAge(r.stdout)
	r.check(t, `2026-01-02T03:04:05.250Z  EXISTING  TCP   10.0.0.9:43512 → 10.96.0.10:80 → 10.0.1.6:9090  default/web:http  ESTABLISHED  client→backend 5 pkts 420 B, backend→client 4 pkts 1800 B, age AGE
2026-01-02T03:04:08.250Z  CLOSED    TCP   10.0.0.9:43512 → 10.96.0.10:80 → 10.0.1.6:9090  default/web:http  rst  client→backend 5 pkts 420 B, backend→client 4 pkts 1800 B, 2.5s
`, "", ExitOK)
}

// TestFlowsFollowHealth: health transitions are HEALTH lines, in the
// table and in JSON; --types health shows them alone, and a filter on a
// VIP leaves them out.
func TestFlowsFollowHealth(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "svc.yaml", flowServices)).checkCode(t, ExitOK)
	be := netip.MustParseAddrPort("10.0.1.6:9090")
	emit := func() {
		vipd.Flows().PublishHealth("default/web", be, flowhub.Health{State: flowhub.HealthFailing, Since: flowT0,
			LastError: "connection refused", Consecutive: 3, Detail: "failing health check (connection refused, 3 in a row)"})
		vipd.Dataplane().Emit(dataplane.FlowEvent{Type: dataplane.FlowNew, Time: flowT0.Add(time.Second), Flow: webFlows()[0]})
		vipd.Flows().PublishHealth("default/web", be, flowhub.Health{State: flowhub.HealthPassing, Since: flowT0.Add(2 * time.Second),
			LastError: "connection refused", Consecutive: 2, Detail: "passing health check (2 in a row)"})
	}
	follow(t, vipd, 3, emit).check(t, `2026-01-02T03:04:05.250Z  HEALTH    default/web 10.0.1.6:9090 failing: connection refused (3 in a row)
2026-01-02T03:04:06.250Z  NEW       TCP   10.0.0.9:43512 → 10.96.0.10:80 → 10.0.1.6:9090  default/web:http
2026-01-02T03:04:07.250Z  HEALTH    default/web 10.0.1.6:9090 passing (2 in a row)
`, "", ExitOK)
	follow(t, vipd, 2, emit, "--types", "health", "-o", "json").check(t,
		`{"flow":{"type":"FLOW_EVENT_TYPE_HEALTH","time":"2026-01-02T03:04:05.250Z","service":"default/web","backend":{"ip":"10.0.1.6","port":9090},"health":{"ip":"10.0.1.6","state":"HEALTH_STATE_FAILING","sinceUnixMs":"1767323045250","lastError":"connection refused","consecutive":3,"detail":"failing health check (connection refused, 3 in a row)"}}}
{"flow":{"type":"FLOW_EVENT_TYPE_HEALTH","time":"2026-01-02T03:04:07.250Z","service":"default/web","backend":{"ip":"10.0.1.6","port":9090},"health":{"ip":"10.0.1.6","state":"HEALTH_STATE_PASSING","sinceUnixMs":"1767323047250","lastError":"connection refused","consecutive":2,"detail":"passing health check (2 in a row)"}}}
`, "", ExitOK)
	follow(t, vipd, 1, emit, "--vip", "10.96.0.10").check(t,
		"2026-01-02T03:04:06.250Z  NEW       TCP   10.0.0.9:43512 → 10.96.0.10:80 → 10.0.1.6:9090  default/web:http\n", "", ExitOK)
}

func TestLostLine(t *testing.T) {
	for _, tc := range []struct {
		lost *vipdv1.LostEvents
		want string
	}{
		{&vipdv1.LostEvents{Count: 12, Source: vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_SUBSCRIBER},
			"!! LOST 12 events (subscriber buffer full: this stream was read too slowly)"},
		{&vipdv1.LostEvents{Count: 1, Source: vipdv1.LostEventsSource_LOST_EVENTS_SOURCE_KERNEL},
			"!! LOST 1 event (dropped by the kernel before vipd could read them)"},
	} {
		if got := lostLine(tc.lost); got != tc.want {
			t.Errorf("lostLine(%v) = %q, want %q", tc.lost, got, tc.want)
		}
	}
}

func TestFlowsUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		wantStderr string
	}{
		{[]string{"flows", "--types", "new"}, "Error: --types needs --follow\nRun 'vipctl flows --help' for usage.\n"},
		{[]string{"flows", "--existing"}, "Error: --existing needs --follow\nRun 'vipctl flows --help' for usage.\n"},
		{[]string{"flows", "-f", "--limit", "3"}, "Error: --limit applies without --follow only\nRun 'vipctl flows --help' for usage.\n"},
		{[]string{"flows", "-f", "--types", "opened"}, "Error: --types: unknown value \"opened\" (want new, closed, existing, health)\nRun 'vipctl flows --help' for usage.\n"},
		{[]string{"flows", "--protocol", "icmp"}, "Error: --protocol: unknown value \"icmp\" (want tcp, udp, sctp)\nRun 'vipctl flows --help' for usage.\n"},
		{[]string{"flows", "-o", "yaml"}, "Error: flows prints -o table or -o json\nRun 'vipctl flows --help' for usage.\n"},
		{[]string{"explain", "10.0.0.9"}, "Error: accepts 2 arg(s), received 1\nRun 'vipctl explain --help' for usage.\n"},
		{[]string{"explain", "10.0.0.9", "10.96.0.10"}, "Error: 10.96.0.10: want VIP:PORT[/PROTO], with IPv6 as [VIP]:PORT\nRun 'vipctl explain --help' for usage.\n"},
		{[]string{"explain", "10.0.0.9", "10.96.0.10:http"}, "Error: 10.96.0.10:http: \"http\" is not a port number\nRun 'vipctl explain --help' for usage.\n"},
		{[]string{"explain", "10.0.0.9", "10.96.0.10:80/icmp"}, "Error: 10.96.0.10:80/icmp: protocol: unknown value \"icmp\" (want tcp, udp, sctp)\nRun 'vipctl explain --help' for usage.\n"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			vipctl(t, "", "", tc.args...).check(t, "", tc.wantStderr, ExitUsage)
		})
	}
}

func TestExplain(t *testing.T) {
	vipd := testserver.Start(t)
	sock := vipd.Socket()
	vipctl(t, sock, "", "apply", "-f", writeFile(t, "svc.yaml", flowServices)).checkCode(t, ExitOK)

	vipctl(t, sock, "", "explain", "10.0.0.9", "10.96.0.10:80").check(t, `Service:                  default/web
Port:                     http 80/TCP→8080
Load balancing:           random
Session affinity:         none
Internal traffic policy:  cluster
Affinity entry:           none
Would pick:               -
Summary:                  10.96.0.10:80/TCP is service default/web port http; 2 of 4 backends are eligible for a new connection. A backend is picked at random, in proportion to the weights: 10.0.1.5 25.0%, 10.0.1.6 75.0%.
  BACKEND   PORT  STATE        WEIGHT  ELIGIBLE  PROBABILITY  WHY NOT
  10.0.1.5  8080  ready        1       yes       25.0%        -
  10.0.1.6  9090  ready        3       yes       75.0%        -
  10.0.1.7  8080  not-serving  1       no        0.0%         not serving
  fd00::5   8080  ready        1       no        0.0%         an IPv6 backend cannot serve an IPv4 VIP
`, "", ExitOK)

	vipd.Dataplane().SetExplain(func(q dataplane.ExplainQuery) (dataplane.Explanation, error) {
		be := netip.MustParseAddrPort("[fd00::5]:53")
		return dataplane.Explanation{AffinityBackend: be, AffinityRemaining: 90 * time.Second, Pick: be}, nil
	})
	r := vipctl(t, sock, "", "explain", "[fd00::9]:5353", "[fd00:96::10]:53/udp")
	if r.code != ExitOK || !strings.Contains(r.stdout, "Affinity entry:           [fd00::5]:53, 1m30s left\n") ||
		!strings.Contains(r.stdout, "Would pick:               [fd00::5]:53\n") {
		t.Errorf("explain with affinity: code %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	want := dataplane.ExplainQuery{Protocol: dataplane.UDP, Client: netip.MustParseAddrPort("[fd00::9]:5353"), VIP: netip.MustParseAddrPort("[fd00:96::10]:53")}
	if q := vipd.Dataplane().ExplainQueries(); len(q) == 0 || q[len(q)-1] != want {
		t.Errorf("vipd asked the dataplane %v, want %v last", q, want)
	}

	r = vipctl(t, sock, "", "-o", "json", "explain", "10.0.0.9", "10.96.0.10:80/tcp")
	if r.code != ExitOK || !strings.Contains(r.stdout, `"probability": 0.75`) || !strings.HasPrefix(r.stdout, "{\n  \"service\": \"default/web\",\n") {
		t.Errorf("explain -o json: code %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	vipctl(t, sock, "", "explain", "10.0.0.9", "10.96.0.10:81").check(t, "",
		"Error: NotFound: no service claims 10.96.0.10:81/TCP\n", ExitNotFound)
	vipctl(t, sock, "", "explain", "client", "10.96.0.10:0").check(t, "", `Error: InvalidArgument: invalid request
  client_ip: "client" is not an IP address
  port: 0 is out of range; 1 to 65535 are allowed
`, ExitInvalid)
}
