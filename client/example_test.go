package client_test

import (
	"context"
	"fmt"
	"log"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/testkit/testserver"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

func Example() {
	// vipd's API, run in-process on a temporary Unix socket over a fake
	// dataplane. A control plane would use vipd's default,
	// "unix:///run/vipd/vipd.sock".
	vipd, err := testserver.New()
	if err != nil {
		log.Fatal(err)
	}
	defer vipd.Close()

	c, err := client.New(vipd.Target())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	// UpsertService returns once the kernel forwards the service.
	svc, err := c.UpsertService(ctx, &vipdv1.Service{
		Name:  "default/web",
		Owner: "my-controller",
		Vips:  []string{"10.96.0.10"},
		Ports: []*vipdv1.Port{{Name: "http", Protocol: vipdv1.Protocol_PROTOCOL_TCP, Port: 80, TargetPort: 8080}},
		Backends: []*vipdv1.Backend{
			{Ip: "10.0.1.5"},
			{Ip: "10.0.2.7", State: vipdv1.BackendState_BACKEND_STATE_TERMINATING},
		},
	}, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("stored %s at generation %d\n", svc.GetName(), svc.GetGeneration())

	svcs, err := c.ListServices(ctx, "my-controller")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range svcs {
		fmt.Printf("%s %v with %d backends\n", s.GetName(), s.GetVips(), len(s.GetBackends()))
	}
	// Output:
	// stored default/web at generation 1
	// default/web [10.96.0.10] with 2 backends
}

// A control plane on another machine reaches vipd's TCP listener (vipd
// --listen) with mutual TLS: the CA that signed vipd's certificate, and a
// client certificate whose identity (URI SAN, else CN) vipd's --authz-file
// allows to change the owners it syncs.
func ExampleWithTLS() {
	tlsConfig, err := client.TLSConfigFromFiles("/etc/vipd/ca.pem", "/etc/vipd/controller.pem", "/etc/vipd/controller-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.New("tcp://node1.example.net:9650", client.WithTLS(tlsConfig))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	resp, err := c.SyncServices(context.Background(), "kubernetes", nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.GetDeleted())
}
