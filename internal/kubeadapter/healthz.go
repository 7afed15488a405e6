package kubeadapter

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// healthBody is /healthz's answer, shaped like kube-proxy's.
type healthBody struct {
	LastUpdated string `json:"lastUpdated"`
	CurrentTime string `json:"currentTime"`
	NodeName    string `json:"nodeName"`
	Healthy     bool   `json:"healthy"`
	Reason      string `json:"reason,omitempty"`
}

// Healthz is the adapter's health check, for /healthz (it answers every
// path and method). It answers 200 once a full sync has succeeded and no
// change has been pending (seen in Kubernetes, or a full sync due, but not
// applied to vipd) for longer than the health timeout (WithHealthTimeout),
// and vipd is the instance (run) that the last full sync wrote to; 503
// otherwise, with the reason: at once when vipd restarted, until a full
// sync with the new vipd has succeeded. The body is JSON: lastUpdated (the last
// successful pass; empty before any), currentTime, nodeName, healthy and
// reason.
func (a *Adapter) Healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		body := a.health(time.Now())
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if !body.Healthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(body)
	})
}

func (a *Adapter) health(now time.Time) healthBody {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := healthBody{CurrentTime: now.UTC().Format(time.RFC3339Nano), NodeName: a.cfg.nodeName}
	if !a.lastSync.IsZero() {
		b.LastUpdated = a.lastSync.UTC().Format(time.RFC3339Nano)
	}
	if !a.synced {
		b.Reason = "no full sync with vipd has succeeded yet"
		return b
	}
	if why := a.instanceHealth(); why != "" {
		b.Reason = why
		return b
	}
	oldest, what := a.inflight, "a change being applied"
	if !a.fullSince.IsZero() && (oldest.IsZero() || a.fullSince.Before(oldest)) {
		oldest, what = a.fullSince, "a full sync ("+a.fullReason+")"
	}
	for name, t := range a.dirty {
		if oldest.IsZero() || t.Before(oldest) {
			oldest, what = t, "service "+name
		}
	}
	if !oldest.IsZero() {
		if d := now.Sub(oldest); d > a.cfg.healthTimeout {
			b.Reason = fmt.Sprintf("%s has been pending for %v, longer than %v", what, d.Round(time.Millisecond), a.cfg.healthTimeout)
			return b
		}
	}
	b.Healthy = true
	return b
}
