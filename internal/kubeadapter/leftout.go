package kubeadapter

// Services left out of vipd: the reasons, the record of each, and the
// retry of those that a pass may have made room for.

import (
	"time"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
)

// Reasons a Service is left out of vipd, or its latest change is (the
// reason label of vipd_k8s_services_left_out). Those of a SyncServices
// refusal come from the reason vipd gives for each service it names
// (culpritReason).
const (
	// ReasonOtherOwner: vipd has a service of that name under another owner.
	ReasonOtherOwner = "other-owner"
	// ReasonConflict: a VIP:port of it is another service's (AlreadyExists).
	ReasonConflict = "conflict"
	// ReasonInvalid: vipd refused it as invalid, or it could not be converted.
	ReasonInvalid = "invalid"
	// ReasonUnsupported: vipd's dataplane cannot honour it (FailedPrecondition).
	ReasonUnsupported = "unsupported"
	// ReasonOverLimit: it would take vipd past one of its totals
	// (--max-services, --max-total-backends: ResourceExhausted with a
	// google.rpc.QuotaFailure).
	ReasonOverLimit = "over-limit"
)

var reasons = []string{ReasonOtherOwner, ReasonConflict, ReasonInvalid, ReasonUnsupported, ReasonOverLimit}

// externalReasons are the reasons a service's external part is left out
// while its cluster IPs are programmed (vipd_k8s_services_external_left_out).
var externalReasons = []string{ReasonConflict, ReasonInvalid, ReasonUnsupported}

// leave records that name is not programmed, or only in the version vipd
// had before a refused change (the per-service pass and the full sync
// both keep it: see heldOf), and why; svc, when not nil, is the version
// refused, which is not tried again until it changes.
func (a *Adapter) leave(name, reason string, svc *vipdv1.Service, err error) {
	if a.leftOut[name] != reason && a.prevLeftOut[name] != reason {
		a.log.Warn("service left out", "service", name, "reason", reason, "error", err)
	}
	a.leftOut[name] = reason
	if svc != nil {
		a.refused[name] = svc
	}
}

// retryFreed marks dirty again, after a pass that deleted a service or took
// VIP:ports off one, the Services left out for a VIP:port conflict or over
// vipd's limits, and those programmed without their external part for a
// conflict: they may fit now. A retry that fails again frees nothing, so
// this does not loop.
func (a *Adapter) retryFreed() {
	if !a.freed {
		return
	}
	a.freed = false
	for name, reason := range a.leftOut {
		if reason == ReasonConflict || reason == ReasonOverLimit {
			delete(a.refused, name)
			a.markDirty(name, time.Time{})
		}
	}
	for name, reason := range a.externalLeft {
		if rec, ok := a.applied[name]; ok && reason == ReasonConflict {
			rec.spec = nil // unequal to any conversion: written again
			a.applied[name] = rec
			a.markDirty(name, time.Time{})
		}
	}
}
