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
// less the "watch" verb on EndpointSlices and expects the apiserver to
// refuse it, visibly in its log. Every other scenario runs with the
// manifest as shipped and fails at cleanup on any such refusal (see
// vipdnode.Options.AllowForbidden): this test shows that check catches a
// manifest that grants too little.
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
    verbs: ["get", "list"]`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}

	c := cluster.Start(t)
	node := vipdnode.Start(t, c, vipdnode.Options{Bin: bin, NodeName: thisNode, RBAC: weak, NoWait: true, AllowForbidden: true})
	deadline := time.Now().Add(30 * time.Second)
	for len(node.Forbidden()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("vipd-k8s ran 30 s without the right to watch EndpointSlices and its log shows no refusal:\n%s", node.Adapter.Tail(20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("refused as expected: %s", node.Forbidden()[0])
}
