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
// It owns the file formats and their spelling only: it must not validate
// services beyond what decoding needs (vipd does that), nor talk to vipd.
// Kubernetes documents (those with apiVersion or kind) are collected for a
// converter in kubernetes.go, which supports no kind yet.
package manifest
