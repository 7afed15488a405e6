package kubee2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
)

const deployDir = "../../deploy/kubernetes"

// TestDeployManifests checks deploy/kubernetes the way kubectl apply
// would not until a cluster runs it: every document decodes strictly
// (no unknown or misspelt field), the RBAC lets the adapter's service
// account list and watch Services and EndpointSlices, and every command
// line of the DaemonSet's containers and probes names only flags that
// the binaries have (each is run with --help added).
func TestDeployManifests(t *testing.T) {
	strict := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", deployDir, err)
	}
	var objs []runtime.Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			if len(strings.TrimSpace(string(stripComments([]byte(doc))))) == 0 {
				continue
			}
			obj, _, err := strict.Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("%s, document %d: %v", f, i+1, err)
			}
			objs = append(objs, obj)
		}
	}

	var ds *appsv1.DaemonSet
	var role *rbacv1.ClusterRole
	var binding *rbacv1.ClusterRoleBinding
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *rbacv1.ClusterRole:
			role = o
		case *rbacv1.ClusterRoleBinding:
			binding = o
		}
	}
	if ds == nil || role == nil || binding == nil {
		t.Fatalf("want a DaemonSet, a ClusterRole and a ClusterRoleBinding; got %d objects", len(objs))
	}
	for _, want := range []struct{ group, resource string }{{"", "services"}, {"discovery.k8s.io", "endpointslices"}} {
		if !allows(role, want.group, want.resource, "list", "watch") {
			t.Errorf("ClusterRole %s does not allow list and watch of %s", role.Name, want.resource)
		}
	}
	sa := ds.Spec.Template.Spec.ServiceAccountName
	if binding.RoleRef.Name != role.Name || !slices.ContainsFunc(binding.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == ds.Namespace
	}) {
		t.Errorf("ClusterRoleBinding %s does not bind %s to %s/%s", binding.Name, role.Name, ds.Namespace, sa)
	}
	if !ds.Spec.Template.Spec.HostNetwork {
		t.Error("the DaemonSet's pods must use the node's network namespace (hostNetwork)")
	}

	names := map[string]bool{}
	for _, c := range ds.Spec.Template.Spec.Containers {
		names[c.Name] = true
		checkCommand(t, c.Name, c.Env, slices.Concat(c.Command, c.Args))
		for probe, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if p != nil && p.Exec != nil {
				checkCommand(t, c.Name+" "+probe+" probe", c.Env, p.Exec.Command)
			}
		}
	}
	if !names["vipd"] || !names["vipd-k8s"] {
		t.Errorf("containers %v; want vipd and vipd-k8s", names)
	}
}

func allows(role *rbacv1.ClusterRole, group, resource string, verbs ...string) bool {
	for _, r := range role.Rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) &&
			!slices.ContainsFunc(verbs, func(v string) bool { return !slices.Contains(r.Verbs, v) }) {
			return true
		}
	}
	return false
}

// checkCommand runs a container's command line, with $(VAR) references
// to its env filled in and --help added, and fails the test unless it
// exits 0: an unknown flag, or a bad value for a typed one, fails.
func checkCommand(t *testing.T, what string, env []corev1.EnvVar, argv []string) {
	t.Helper()
	if len(argv) == 0 {
		t.Errorf("%s: no command", what)
		return
	}
	bin := filepath.Join(bins, argv[0])
	if _, err := os.Stat(bin); err != nil {
		t.Errorf("%s: runs %s, which this repository does not build", what, argv[0])
		return
	}
	args := make([]string, 0, len(argv))
	for _, a := range argv[1:] {
		for _, e := range env {
			a = strings.ReplaceAll(a, "$("+e.Name+")", "example-node")
		}
		args = append(args, a)
	}
	out, err := exec.Command(bin, append(args, "--help")...).CombinedOutput()
	if err != nil {
		t.Errorf("%s: %s %s --help: %v\n%s", what, argv[0], strings.Join(args, " "), err, out)
	}
}
