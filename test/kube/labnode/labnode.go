package labnode

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
	"github.com/vipd/vipd/test/soak"

	"github.com/vipd/vipd/test/kube/cluster"
	"github.com/vipd/vipd/test/kube/vipdnode"
)

// Options configure a Node.
type Options struct {
	// Bin holds vipd and vipd-k8s (vipdnode.BuildBinaries).
	Bin string
	// Dataplane is vipd's dataplane: "ebpf" or "iptables".
	Dataplane string
	// NodeName is the Kubernetes node that the lab's node stands for.
	NodeName string
	// Clients name pods to create at once, without servers (netlab's
	// rules on names).
	Clients []string
	// AdapterArgs are extra vipd-k8s flags.
	AdapterArgs []string
}

// Node is a lab node programmed by vipd on a real dataplane, and the
// vipd-k8s that drives that vipd from a cluster. The embedded soak.Env
// holds the lab (Lab, Node), vipd (Vipd) and an API client of it (API).
type Node struct {
	*soak.Env
	Adapter *vipdnode.Adapter
}

// Start builds the lab with opts.Clients, starts vipd on opts.Dataplane in
// the lab's node namespace and waits until it serves, then starts
// vipd-k8s for opts.NodeName against c and that vipd and waits until it
// is healthy. It skips the test when the dataplane cannot run on this
// kernel (fails it under CI=true). Cleanups stop both processes and
// remove the lab, vipd's bpffs, directory and test cgroup.
func Start(t testing.TB, c *cluster.Cluster, opts Options) *Node {
	t.Helper()
	soak.RequireDataplane(t, opts.Dataplane)
	env := soak.NewEnv(t, filepath.Join(opts.Bin, "vipd"), opts.Dataplane, soak.Spec{Clients: opts.Clients})
	a := vipdnode.StartAdapter(t, c, vipdnode.AdapterOptions{
		Bin: opts.Bin, NodeName: opts.NodeName, VIPD: "unix://" + env.Vipd.Socket, Args: opts.AdapterArgs,
	})
	return &Node{Env: env, Adapter: a}
}

// AddPod creates the pod name on the lab's node and starts an echo server
// answering as name on ports of its IPv4 and IPv6 addresses (TCP and UDP;
// see netlab.Echo). The pod lives until RemovePod or the lab's removal.
func (n *Node) AddPod(name string, ports ...uint16) (*netlab.Pod, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := n.Node.AddPod(ctx, name)
	if err != nil {
		return nil, err
	}
	if _, err := p.StartEcho(name, ports...); err != nil {
		return nil, fmt.Errorf("pod %s: %w", name, err)
	}
	return p, nil
}

// RemovePod stops the pod's servers and removes it from the lab: its
// addresses are unreachable from then on, as after a kubelet tore the pod
// down.
func (n *Node) RemovePod(name string) error {
	return n.Node.RemovePod(name)
}
