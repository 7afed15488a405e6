package vipdnode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
)

// ApplyRBAC creates the objects of the manifest at path (the project's
// deploy/kubernetes/rbac.yaml) in the cluster, as kubectl apply would on a
// fresh cluster, and returns the ServiceAccount it defines. It knows the
// kinds an RBAC manifest holds and refuses any other.
func ApplyRBAC(ctx context.Context, admin kubernetes.Interface, path string) (*corev1.ServiceAccount, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := decodeManifests(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var sa *corev1.ServiceAccount
	create := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	for _, obj := range objs {
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			if sa != nil {
				return nil, fmt.Errorf("%s: more than one ServiceAccount", path)
			}
			sa, err = admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, create)
		case *rbacv1.ClusterRole:
			_, err = admin.RbacV1().ClusterRoles().Create(ctx, o, create)
		case *rbacv1.ClusterRoleBinding:
			_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, o, create)
		case *rbacv1.Role:
			_, err = admin.RbacV1().Roles(o.Namespace).Create(ctx, o, create)
		case *rbacv1.RoleBinding:
			_, err = admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, create)
		default:
			return nil, fmt.Errorf("%s: unexpected kind %T in an RBAC manifest", path, obj)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: create %T: %w", path, obj, err)
		}
	}
	if sa == nil {
		return nil, fmt.Errorf("%s: no ServiceAccount", path)
	}
	return sa, nil
}

// decodeManifests decodes each YAML document of data into a typed object.
func decodeManifests(data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if isEmptyYAML(doc) {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
}

// isEmptyYAML says whether doc holds only comments and blank lines.
func isEmptyYAML(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

// Token mints a token for the ServiceAccount through the TokenRequest API,
// as the kubelet does for a pod's projected token.
func Token(ctx context.Context, admin kubernetes.Interface, sa *corev1.ServiceAccount) (string, error) {
	expiry := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	return tr.Status.Token, nil
}
