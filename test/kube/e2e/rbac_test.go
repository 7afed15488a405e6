package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vipd/vipd/test/kube/cluster"
	"github.com/vipd/vipd/test/kube/vipdnode"
)

// TestRBACMissingVerbFails runs the adapter with deploy/kubernetes/rbac.yaml
// less the "list" verb on EndpointSlices: it must never become healthy, and
// say why. This is the check that the other scenarios, which pass with the
// manifest as shipped, would notice a manifest that grants too little.
func TestRBACMissingVerbFails(t *testing.T) {
	mod, err := cluster.ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(mod, "..", "..", "deploy", "kubernetes", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const rule = `resources: ["endpointslices"]
    verbs: ["get", "list", "watch"]`
	if !strings.Contains(string(manifest), rule) {
		t.Fatalf("rbac.yaml has no rule %q to weaken; update this test with the manifest", rule)
	}
	weak := filepath.Join(t.TempDir(), "rbac.yaml")
	if err := os.WriteFile(weak, []byte(strings.Replace(string(manifest), rule, `resources: ["endpointslices"]
    verbs: ["get", "watch"]`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}

	c := cluster.Start(t)
	node := vipdnode.Start(t, c, vipdnode.Options{Bin: bin, NodeName: thisNode, RBAC: weak, NoWait: true})
	if err := node.WaitHealthy(20 * time.Second); err == nil {
		t.Fatal("vipd-k8s became healthy without the right to list EndpointSlices")
	}
	log, err := os.ReadFile(node.Adapter.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "forbidden") {
		t.Errorf("vipd-k8s's log does not say it was forbidden:\n%s", node.Adapter.Tail(20))
	}
}
