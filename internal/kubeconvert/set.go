package kubeconvert

import (
	"cmp"
	"errors"
	"slices"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Left is a Service that ConvertAll left out, and why.
type Left struct {
	// Service is the vipd name, namespace/name.
	Service string
	// Err wraps ErrSkipped for a Service that kube-proxy would not program
	// either; any other error means the Service could not be converted.
	Err error
}

// ConvertAll converts every Service in services with its slices (see
// Convert), in name order. Services it cannot or should not program are
// left out and listed in left, so that one bad Service never holds up the
// others. EndpointSlices of Services that are not in services are ignored:
// a Service deleted while its slices linger has no vipd service.
func ConvertAll(services []*corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, opts Options) (out []*vipdv1.Service, left []Left) {
	out, _, left = ConvertAllWithOmissions(services, endpointSlices, opts)
	return out, left
}

// ConvertAllWithOmissions is ConvertAll, and also returns, by vipd name,
// what each converted service leaves out of its Service (see
// ConvertWithOmissions); services that leave nothing out are absent.
func ConvertAllWithOmissions(services []*corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, opts Options) (out []*vipdv1.Service, omitted map[string][]Omission, left []Left) {
	omitted = map[string][]Omission{}
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range endpointSlices {
		if svc := s.Labels[discoveryv1.LabelServiceName]; svc != "" {
			key := Name(s.Namespace, svc)
			bySvc[key] = append(bySvc[key], s)
		}
	}
	for _, svc := range services {
		converted, omissions, err := ConvertWithOmissions(svc, bySvc[Name(svc.Namespace, svc.Name)], opts)
		if err != nil {
			left = append(left, Left{Service: Name(svc.Namespace, svc.Name), Err: err})
			continue
		}
		out = append(out, converted)
		if len(omissions) > 0 {
			omitted[converted.Name] = omissions
		}
	}
	slices.SortFunc(out, func(a, b *vipdv1.Service) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(left, func(a, b Left) int { return cmp.Compare(a.Service, b.Service) })
	return out, omitted, left
}

// IsSkipped reports whether err says a Service is deliberately not
// programmed, rather than broken.
func IsSkipped(err error) bool { return errors.Is(err, ErrSkipped) }
