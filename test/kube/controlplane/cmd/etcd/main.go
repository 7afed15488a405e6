// Command etcd is the upstream etcd server, built from the Go module proxy
// for vipd's Kubernetes tests (the harness in package cluster starts it).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
