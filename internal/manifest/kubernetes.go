package manifest

import vipdv1 "github.com/vipd/vipd/proto/vipd/v1"

// kubeObject is a Kubernetes document (one with apiVersion or kind), held
// until the whole source has been read.
type kubeObject struct {
	at         position
	path       string
	apiVersion string
	kind       string
	object     map[string]any
}

// asKubernetes reports whether obj is a Kubernetes object rather than a
// service. vipd.v1.Service has neither apiVersion nor kind, so the two
// cannot be confused.
func asKubernetes(obj map[string]any, path string, at position) (kubeObject, bool) {
	_, hasVersion := obj["apiVersion"]
	_, hasKind := obj["kind"]
	if !hasVersion && !hasKind {
		return kubeObject{}, false
	}
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	return kubeObject{at: at, path: path, apiVersion: apiVersion, kind: kind, object: obj}, true
}

// fromKubernetes converts the Kubernetes objects of one source into
// services, which Load appends after the source's vipd services. It gets all
// of them at once because a Service's endpoints come in separate
// EndpointSlice documents that name it by their kubernetes.io/service-name
// label. No kind is supported yet: every object is an error.
func fromKubernetes(objs []kubeObject) ([]*vipdv1.Service, error) {
	for _, o := range objs {
		kind := o.kind
		if kind == "" {
			kind = "(none)"
		}
		return nil, o.at.errorf(o.path, "kind %s is not supported yet (apiVersion %q); write vipd.v1.Service objects", kind, o.apiVersion)
	}
	return nil, nil
}
