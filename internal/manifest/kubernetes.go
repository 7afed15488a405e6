package manifest

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Kubernetes kinds read, and the apiVersion each needs.
const (
	kindService           = "Service"
	kindEndpointSlice     = "EndpointSlice"
	kindList              = "List"
	kindServiceList       = "ServiceList"
	kindEndpointSliceList = "EndpointSliceList"

	coreV1      = "v1"
	discoveryV1 = "discovery.k8s.io/v1"
)

// kubeKinds maps each kind read to its apiVersion.
var kubeKinds = map[string]string{
	kindService:           coreV1,
	kindEndpointSlice:     discoveryV1,
	kindList:              coreV1,
	kindServiceList:       coreV1,
	kindEndpointSliceList: discoveryV1,
}

// listItemKind is the kind of a typed list's items, which may leave out
// their apiVersion and kind, as the apiserver's list responses do.
var listItemKind = map[string]string{
	kindServiceList:       kindService,
	kindEndpointSliceList: kindEndpointSlice,
}

const kindsRead = "want Service (v1), EndpointSlice (discovery.k8s.io/v1), " +
	"or a List, ServiceList or EndpointSliceList of them"

// defaultNamespace is the namespace of an object that names none, as
// kubectl applies it.
const defaultNamespace = "default"

// located is a Kubernetes object and where it was read, for errors.
type located[T any] struct {
	at     position
	path   string
	object T
}

// kubeObjects are the Kubernetes objects read from every source of a
// Loader so far. A Service's endpoints come in separate EndpointSlice
// documents, possibly in another file, that name it by their
// kubernetes.io/service-name label, so nothing is converted until all are
// read.
type kubeObjects struct {
	services []located[*corev1.Service]
	slices   []located[*discoveryv1.EndpointSlice]
	seen     map[string]position // kind namespace/name → where first read
}

// isKubernetes reports whether obj is a Kubernetes object rather than a
// service. vipd.v1.Service has neither apiVersion nor kind, so the two
// cannot be confused.
func isKubernetes(obj map[string]any) bool {
	_, hasVersion := obj["apiVersion"]
	_, hasKind := obj["kind"]
	return hasVersion || hasKind
}

// add decodes obj, a Kubernetes object at path in a document, strictly
// (see decodeStrict): a Service, an EndpointSlice, or a list of them
// (kubectl get -o yaml prints a List). Anything else is an error, and so
// is an object read twice.
func (k *kubeObjects) add(obj map[string]any, path string, at position) error {
	apiVersion, err := stringField(obj, "apiVersion", path)
	if err != nil {
		return at.wrap(err)
	}
	kind, err := stringField(obj, "kind", path)
	if err != nil {
		return at.wrap(err)
	}
	want, ok := kubeKinds[kind]
	switch {
	case kind == "":
		return at.errorf(joinPath(path, "kind"), "missing (apiVersion %q); %s", apiVersion, kindsRead)
	case !ok:
		return at.errorf(joinPath(path, "kind"), "%q is not read (apiVersion %q); %s", kind, apiVersion, kindsRead)
	case apiVersion == "":
		return at.errorf(joinPath(path, "apiVersion"), "missing; kind %s needs apiVersion %s", kind, want)
	case apiVersion != want:
		return at.errorf(joinPath(path, "apiVersion"), "%q is not read; kind %s needs apiVersion %s", apiVersion, kind, want)
	}
	switch kind {
	case kindService:
		svc, err := decodeStrict[corev1.Service](obj, path)
		if err != nil {
			return at.wrap(err)
		}
		if err := k.record(kind, &svc.ObjectMeta, path, at); err != nil {
			return err
		}
		k.services = append(k.services, located[*corev1.Service]{at: at, path: path, object: svc})
	case kindEndpointSlice:
		slice, err := decodeStrict[discoveryv1.EndpointSlice](obj, path)
		if err != nil {
			return at.wrap(err)
		}
		if err := k.record(kind, &slice.ObjectMeta, path, at); err != nil {
			return err
		}
		k.slices = append(k.slices, located[*discoveryv1.EndpointSlice]{at: at, path: path, object: slice})
	default:
		return k.addList(obj, kind, path, at)
	}
	return nil
}

// kubeList is the shape of every list kind; its items are decoded one by
// one by add.
type kubeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []json.RawMessage `json:"items"`
}

func (k *kubeObjects) addList(obj map[string]any, kind, path string, at position) error {
	if _, err := decodeStrict[kubeList](obj, path); err != nil {
		return at.wrap(err)
	}
	items, _ := obj["items"].([]any)
	for i, item := range items {
		ip := joinPath(path, fmt.Sprintf("items[%d]", i))
		m, ok := item.(map[string]any)
		if !ok {
			return at.errorf(ip, "want an object, got %s", jsonType(item))
		}
		want, typed := listItemKind[kind]
		if typed && !isKubernetes(m) {
			m = maps.Clone(m)
			m["apiVersion"], m["kind"] = kubeKinds[want], want
		}
		switch itemKind, _ := m["kind"].(string); {
		case typed && itemKind != want:
			return at.errorf(joinPath(ip, "kind"), "a %s holds kind %s, not %q", kind, want, itemKind)
		case itemKind == kindList || listItemKind[itemKind] != "":
			return at.errorf(joinPath(ip, "kind"), "a list in a list is not read; %s", kindsRead)
		}
		if err := k.add(m, ip, at); err != nil {
			return err
		}
	}
	return nil
}

// record defaults meta's namespace, requires its name, and refuses an
// object of the same kind and name read before.
func (k *kubeObjects) record(kind string, meta *metav1.ObjectMeta, path string, at position) error {
	if meta.Name == "" {
		return at.errorf(joinPath(path, "metadata.name"), "missing; %s objects need a name", kind)
	}
	if meta.Namespace == "" {
		meta.Namespace = defaultNamespace
	}
	key := kind + " " + meta.Namespace + "/" + meta.Name
	if first, dup := k.seen[key]; dup {
		return at.errorf(path, "%s appears twice (first in %s)", key, first)
	}
	if k.seen == nil {
		k.seen = map[string]position{}
	}
	k.seen[key] = at
	return nil
}

// convert turns the Services read into vipd services with
// kubeconvert.ConvertAll, in name order and with no owner, and says in
// notes what it left out: Services that kube-proxy would not program
// either, and EndpointSlices that belong to no Service read. A Service it
// cannot convert is an error. origins[i] is where svcs[i] was read.
func (k *kubeObjects) convert(opts Options) (svcs []*vipdv1.Service, origins []Origin, notes []string, err error) {
	if len(k.services) == 0 && len(k.slices) == 0 {
		return nil, nil, nil, nil
	}
	services := make([]*corev1.Service, len(k.services))
	byName := map[string]located[*corev1.Service]{}
	for i, s := range k.services {
		services[i] = s.object
		byName[kubeconvert.Name(s.object.Namespace, s.object.Name)] = s
	}
	endpointSlices := make([]*discoveryv1.EndpointSlice, len(k.slices))
	for i, s := range k.slices {
		endpointSlices[i] = s.object
	}
	svcs, left := kubeconvert.ConvertAll(services, endpointSlices, kubeconvert.Options{NodeName: opts.NodeName})
	for _, l := range left {
		s := byName[l.Service]
		if !kubeconvert.IsSkipped(l.Err) {
			return nil, nil, nil, s.at.wrap(&pathError{path: s.path, err: l.Err})
		}
		notes = append(notes, fmt.Sprintf("skipped Service %s: %s", l.Service, kubeconvert.Skipped(s.object)))
	}
	for _, s := range svcs {
		// vipd documents get their owner from "vipctl apply --owner"; so do
		// these. kubeconvert.Owner belongs to the Kubernetes adapter, whose
		// SyncServices would delete them.
		s.Owner = ""
		from := byName[s.GetName()]
		origins = append(origins, Origin{Source: from.at.source, Document: from.at.document, Line: from.at.line, Path: from.path, Kubernetes: true})
	}
	notes = append(notes, sliceNotes(k.slices, byName)...)
	return svcs, origins, notes, nil
}

// sliceNotes says which EndpointSlices kubeconvert ignores: those of no
// Service read, and those whose addresses are not IPs.
func sliceNotes(all []located[*discoveryv1.EndpointSlice], services map[string]located[*corev1.Service]) []string {
	sorted := slices.SortedFunc(slices.Values(all), func(a, b located[*discoveryv1.EndpointSlice]) int {
		return compareNames(a.object.ObjectMeta, b.object.ObjectMeta)
	})
	var notes []string
	for _, l := range sorted {
		s := l.object
		name := kubeconvert.Name(s.Namespace, s.Name)
		owner, labelled := s.Labels[discoveryv1.LabelServiceName]
		switch {
		case !labelled || owner == "":
			notes = append(notes, fmt.Sprintf("EndpointSlice %s: no label %s names its Service; ignored", name, discoveryv1.LabelServiceName))
		case services[kubeconvert.Name(s.Namespace, owner)].object == nil:
			notes = append(notes, fmt.Sprintf("EndpointSlice %s: no Service %s in the input; ignored", name, kubeconvert.Name(s.Namespace, owner)))
		case s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6:
			notes = append(notes, fmt.Sprintf("EndpointSlice %s: addressType %q is not IPv4 or IPv6; ignored", name, s.AddressType))
		}
	}
	return notes
}

func compareNames(a, b metav1.ObjectMeta) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// stringField returns obj[key], which must be a string if present.
func stringField(obj map[string]any, key, path string) (string, error) {
	v, ok := obj[key]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", errorAt(joinPath(path, key), "want a string, got %s", jsonType(v))
	}
	return s, nil
}

// clone returns a copy of k that can be added to without changing k.
func (k kubeObjects) clone() kubeObjects {
	return kubeObjects{services: slices.Clip(k.services), slices: slices.Clip(k.slices), seen: maps.Clone(k.seen)}
}
