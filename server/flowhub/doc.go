// Package flowhub fans the flow events of one dataplane.FlowSource out to
// subscribers, the WatchFlows streams of the API.
//
// A Hub reads the source from one goroutine (Run), resolves each flow's VIP,
// port and protocol to the service port that claims it, and hands every
// event to each subscriber whose Filter it matches. Every subscriber has a
// bounded buffer of its own: when it is full, the events it misses are
// counted, exactly, and reported to it before its next event, so that a
// slow subscriber never blocks the reader, the dataplane or the other
// subscribers. Events the kernel dropped are counted and reported to every
// subscriber the same way.
//
// The hub also carries backends' health-check transitions
// (PublishHealth), which are not flows but decide where new flows go: they
// reach the subscribers whose filter selects them, the same way.
//
// It must not block the source's reader, speak gRPC (package server turns
// subscriptions into streams), or touch the kernel.
package flowhub
