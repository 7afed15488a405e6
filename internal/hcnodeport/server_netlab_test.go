package hcnodeport_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/dataplane"
	"github.com/vipd/vipd/internal/hcnodeport"
	"github.com/vipd/vipd/internal/testkit/netlab"
)

// client makes HTTP requests from inside ns.
func client(ns *netlab.NS) *http.Client { return ns.HTTPClient(5 * time.Second) }

type reply struct {
	code int
	body string
	hdr  http.Header
	err  error
}

func get(c *http.Client, addr netip.Addr, port uint16, path string) reply {
	resp, err := c.Get("http://" + net.JoinHostPort(addr.String(), strconv.Itoa(int(port))) + path)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{code: resp.StatusCode, body: string(b), hdr: resp.Header, err: err}
}

// waitReply polls until the reply satisfies ok.
func waitReply(t *testing.T, what string, c *http.Client, addr netip.Addr, port uint16, ok func(reply) bool) reply {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := get(c, addr, port, "/healthz")
		if ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s:%d: timed out; last reply %d %q %v", what, addr, port, r.code, r.body, r.err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func refused(r reply) bool { return errors.Is(r.err, syscall.ECONNREFUSED) }

// changed sets st's change hint.
func changed(st *dataplane.State, names ...string) *dataplane.State {
	st.Changed = append([]string{}, names...)
	return st
}

func webState(node dataplane.Node, backends ...dataplane.Backend) *dataplane.State {
	return &dataplane.State{Node: node, Services: map[string]*dataplane.Service{
		"default/web": {
			Ports:                 []dataplane.Port{{Protocol: dataplane.TCP, Port: 80, TargetPort: 8080, NodePort: 30080}},
			ExternalTrafficPolicy: dataplane.TrafficPolicyLocal, HealthCheckNodePort: 30100,
			Backends: backends,
		},
	}}
}

// TestServeInLabNode: the health-check node port answers from inside the
// node's namespace, on every node-port address, with kube-proxy's body;
// it flips between 200 and 503 as local backends come and go (a backend
// that health checks lowered to NOT_SERVING does not count); it follows
// the node-port addresses; and it closes when the service goes.
func TestServeInLabNode(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{})
	node, up := lab.Node(1), lab.Upstream()
	v4, v6 := node.IPv4(), node.IPv6()
	both := dataplane.Node{NodePortAddresses: []netip.Addr{v4, v6}}
	s := hcnodeport.New(hclog.NewNullLogger(), node.Path())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	c := client(up)

	local := backend("198.18.1.10", true, dataplane.BackendReady)
	remote := backend("198.18.2.10", false, dataplane.BackendReady)
	s.Update(webState(both, local, remote))
	for _, a := range []netip.Addr{v4, v6} {
		r := waitReply(t, "200", c, a, 30100, func(r reply) bool { return r.code == 200 })
		if want := `{"service":{"namespace":"default","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}`; r.body != want {
			t.Errorf("%s: body %s, want %s", a, r.body, want)
		}
		if r.hdr.Get("Content-Type") != "application/json" || r.hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", a, r.hdr)
		}
	}
	if r := get(c, v4, 30100, "/any/path?x=1"); r.code != 200 {
		t.Errorf("another path: %d %v", r.code, r.err)
	}

	// Health checks lowered the local backend: 503, no local endpoint.
	// (A partial apply naming the service, as the reconciler's.)
	local.State = dataplane.BackendNotServing
	s.Update(changed(webState(both, local, remote), "default/web"))
	r := waitReply(t, "503", c, v4, 30100, func(r reply) bool { return r.code == 503 })
	if want := `{"service":{"namespace":"default","name":"web"},"localEndpoints":0,"serviceProxyHealthy":true}`; r.body != want {
		t.Errorf("503 body %s, want %s", r.body, want)
	}
	local.State = dataplane.BackendReady
	s.Update(webState(both, local, backend("198.18.1.11", true, dataplane.BackendReady)))
	waitReply(t, "200 with two", c, v6, 30100, func(r reply) bool {
		return r.code == 200 && strings.Contains(r.body, `"localEndpoints":2`)
	})

	// The IPv6 address is no node-port address any more: not served there.
	// (An apply of only a Node change names no service.)
	s.Update(changed(webState(dataplane.Node{NodePortAddresses: []netip.Addr{v4}}, local, backend("198.18.1.11", true, dataplane.BackendReady))))
	waitReply(t, "refused", c, v6, 30100, refused)
	if r := get(c, v4, 30100, "/"); r.code != 200 {
		t.Errorf("v4 after v6 went: %d %v", r.code, r.err)
	}
	s.Update(webState(both, local))
	waitReply(t, "200 on v6 again", c, v6, 30100, func(r reply) bool { return r.code == 200 })

	// The service goes: both listeners close.
	s.Update(changed(&dataplane.State{Node: both}, "default/web"))
	for _, a := range []netip.Addr{v4, v6} {
		waitReply(t, "refused once the service is gone", c, a, 30100, refused)
	}
	if ws := s.Warnings(); len(ws) != 0 {
		t.Errorf("warnings %+v", ws)
	}
}

// TestListenFailureIsAWarning: a port that something else holds in the
// node is a warning, not an error, and is served once it is free.
func TestListenFailureIsAWarning(t *testing.T) {
	lab := netlab.New(t, netlab.Spec{})
	node, up := lab.Node(1), lab.Upstream()
	v4 := node.IPv4()
	var taken net.Listener
	if err := node.Do(func() error {
		var err error
		taken, err = net.Listen("tcp4", netip.AddrPortFrom(v4, 30100).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	s := hcnodeport.New(hclog.NewNullLogger(), node.Path())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	st := webState(dataplane.Node{NodePortAddresses: []netip.Addr{v4}}, backend("198.18.1.10", true, dataplane.BackendReady))
	s.Update(st)
	deadline := time.Now().Add(5 * time.Second)
	for len(s.Warnings()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no warning for a port in use")
		}
		time.Sleep(10 * time.Millisecond)
	}
	w := s.Warnings()[0]
	if w.Check != hcnodeport.Check || !strings.Contains(w.Message, "default/web") || !strings.Contains(w.Message, netip.AddrPortFrom(v4, 30100).String()) || w.Since.IsZero() {
		t.Errorf("warning %+v", w)
	}
	taken.Close()
	s.Update(st) // the next apply retries
	waitReply(t, "200 once free", client(up), v4, 30100, func(r reply) bool { return r.code == 200 })
	deadline = time.Now().Add(5 * time.Second)
	for len(s.Warnings()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("warning stays: %+v", s.Warnings())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
