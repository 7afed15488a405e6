// Package manifest reads the service files of "vipctl apply -f": YAML or
// JSON holding one service, a list of services, an object {services: [...]}
// (what "vipctl service list -o json" prints), or several YAML documents
// separated by "---", each any of those.
//
// A service is the protojson form of vipd.v1.Service, with both field
// spellings (target_port and targetPort) and, for enums, short
// case-insensitive forms besides the full names (udp for PROTOCOL_UDP,
// not-serving for BACKEND_STATE_NOT_SERVING). Unknown fields are errors.
// Errors are *Error values that name the source, the document and, where
// known, the field.
//
// A document or list item with apiVersion or kind is a Kubernetes object
// instead: a Service (v1), an EndpointSlice (discovery.k8s.io/v1), or a
// List (v1), ServiceList or EndpointSliceList of them, as "kubectl get
// svc,endpointslices -o yaml" prints them; a file may mix them with vipd
// services. They are decoded into the k8s.io/api types as strictly as the
// apiserver does, with its decoder, sigs.k8s.io/json (every field kubectl
// prints, status and managedFields included, is read; any other, or one
// spelled in another case, is an error naming its path), a missing
// metadata.namespace is "default", and once every source of a Loader is
// read they are converted by internal/kubeconvert, the converter of the
// Kubernetes adapter, so that a Service means the same by either route.
// Converted services have no owner (vipctl apply --owner gives one). What
// kubeconvert leaves out on purpose (headless and ExternalName Services,
// those of another proxy) and EndpointSlices of no Service read are
// reported in Result.Notes, not as errors.
//
// It owns the file formats and their spelling only: it must not validate
// services beyond what decoding needs (vipd does that), convert Kubernetes
// objects itself, nor talk to vipd.
package manifest
