package kubeadapter

// vipd's health and identity: a full pass waits for vipd to serve, and a
// vipd the adapter has not fully synced (a restarted one, which may have
// come back without its state) makes the next pass a full sync.
//
// vipd names each of its runs with an instance ID (GetStatus's
// instance_id, and the vipd-instance-id header of every health answer).
// The adapter remembers the instance its last successful full sync wrote
// to, and compares that with the instance it sees: on every (re)connect
// of its health Watch, and before each pass that is not already a full
// one. Whatever happened in between (two restarts inside one reconnect
// wait, the second without state), another instance means a full sync.

import (
	"context"
	"fmt"
	"time"

	"github.com/vipd/vipd/client"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

const (
	// watchRetryMax bounds the wait between two attempts to watch vipd's
	// health while it stays away. The attempts themselves wait for the
	// connection (WaitForReady), so the wait matters only for a vipd that
	// answers the watch with an error.
	watchRetryMax = time.Second
	// instanceCheckTimeout bounds the GetStatus that reads vipd's instance
	// before a pass; a vipd that does not answer within it is left to the
	// pass's own calls.
	instanceCheckTimeout = time.Second
)

// instances is what the adapter knows of vipd's instance IDs, guarded by
// Adapter.mu. An empty ID is unknown: a vipd too old to send one, or none
// seen yet.
type instances struct {
	// synced is the instance the last successful full sync wrote to.
	synced string
	// pass is the instance read before the writes of the full pass in
	// progress (empty between full passes); it becomes synced when the
	// pass succeeds.
	pass string
	// reading: a full pass has been taken and has not read its instance
	// yet; what it reads will be at least as new as anything seen now.
	reading bool
	// seen is the instance last seen, by the health watch or a GetStatus.
	seen string
}

// fullPassTaken notes that a pass was taken, full or not. The caller
// holds a.mu.
func (a *Adapter) fullPassTaken(full bool) { a.inst.reading = full }

// sawInstance records that vipd is instance id, seen via what, and marks a
// full sync unless the last successful full sync (or the one in progress)
// wrote to that very instance, or a full pass in progress is yet to read
// it. An unknown (empty) id marks one only when
// unknownIsNew: vipd answered without an ID after the health stream broke.
func (a *Adapter) sawInstance(id, via string, unknownIsNew bool) {
	a.mu.Lock()
	prev, synced := a.inst.seen, a.inst.synced
	if id != "" {
		a.inst.seen = id
	}
	stale := id != "" && id != synced && id != a.inst.pass && !a.inst.reading
	a.mu.Unlock()
	switch {
	case stale:
		if id != prev && synced != "" {
			a.log.Info("vipd is an instance the adapter has not fully synced (vipd restarted); a full sync follows",
				"instance_id", id, "synced_instance_id", synced, "via", via)
		}
		a.markFull("vipd instance " + id + " not fully synced")
	case id == "" && unknownIsNew:
		a.markFull("vipd reconnected (it sends no instance ID)")
	}
}

// instanceHealth says why /healthz must fail while vipd is an instance the
// adapter has not fully synced; "" when it is the synced one or unknown.
// The caller holds a.mu.
func (a *Adapter) instanceHealth() string {
	if a.inst.seen == "" || a.inst.seen == a.inst.synced {
		return ""
	}
	return fmt.Sprintf("vipd restarted (instance %s; the last full sync was to %s) and no full sync with it has succeeded yet",
		a.inst.seen, orNone(a.inst.synced))
}

func orNone(id string) string {
	if id == "" {
		return "none"
	}
	return id
}

// fullPassDone ends a full pass: when it succeeded, the instance read
// before its writes is the synced one. The caller holds a.mu.
func (a *Adapter) fullPassDone(ok bool) {
	if ok {
		a.inst.synced = a.inst.pass
	}
	a.inst.pass, a.inst.reading = "", false
}

// checkInstance reads vipd's instance (GetStatus) before a pass, unless a
// full sync is due anyway, so that a restart the health watch has not
// reported yet turns the pass into a full sync. A vipd that does not
// answer is left to the pass, whose failing writes say so.
func (a *Adapter) checkInstance(ctx context.Context) {
	a.mu.Lock()
	full := !a.fullSince.IsZero()
	a.mu.Unlock()
	if full {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, instanceCheckTimeout)
	st, err := a.vipd.Status(cctx)
	cancel()
	if err != nil {
		a.log.Debug("could not read vipd's instance before a pass", "error", err)
		return
	}
	a.sawInstance(st.GetInstanceId(), "status", false)
}

// waitVIPD waits for vipd to serve and reads its instance, which a full
// pass writes to. A vipd that answers but stays not serving (vipd
// --recover holds its dataplane until a SyncServices) is synced all the
// same: the SyncServices is what it waits for.
func (a *Adapter) waitVIPD(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, a.cfg.servingWait)
	werr := a.vipd.WaitServing(wctx)
	cancel()
	if werr != nil && ctx.Err() != nil {
		return werr
	}
	st, err := a.vipd.Status(ctx)
	if err != nil {
		if werr != nil {
			return fmt.Errorf("wait for vipd: %w", werr)
		}
		return fmt.Errorf("read vipd's status: %w", err)
	}
	if werr != nil {
		a.log.Warn("vipd answers but is not serving; syncing anyway (a SyncServices ends a --recover hold)", "reason", st.GetLastError())
	}
	// Read before the writes: should vipd restart after this, the pass
	// wrote (at most) to this instance, and the next one is another.
	id := st.GetInstanceId()
	a.mu.Lock()
	a.inst.pass, a.inst.reading = id, false
	if id != "" {
		a.inst.seen = id
	}
	a.mu.Unlock()
	return nil
}

// watchVIPD follows vipd's health with a Watch stream until ctx ends. On
// every (re)connect it reads vipd's instance from the stream's header: an
// instance the adapter has not fully synced makes the next pass a full
// sync (see sawInstance). A vipd that stops serving makes one too. After a
// stream that answered breaks, the watch starts again at once, waiting
// for the connection to come back, so that a restarted vipd is seen as
// soon as it answers; attempts that fail back off from the retry
// backoff's minimum to watchRetryMax.
func (a *Adapter) watchVIPD(ctx context.Context) {
	backoff := a.cfg.backoffMin
	reconnect := false
	for ctx.Err() == nil {
		answered, err := a.watchOnce(ctx, reconnect)
		if ctx.Err() != nil {
			return
		}
		if answered {
			reconnect, backoff = true, a.cfg.backoffMin
			a.log.Info("vipd's health stream broke; watching again", "error", err)
			continue
		}
		a.log.Debug("cannot watch vipd's health; retrying", "in", backoff, "error", err)
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, watchRetryMax)
	}
}

// watchOnce watches vipd's health over one stream until it breaks, and
// reports whether vipd answered on it. reconnect says that an earlier
// stream answered, so that a vipd without an instance ID is taken for a
// restarted one.
func (a *Adapter) watchOnce(ctx context.Context, reconnect bool) (answered bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := a.vipd.HealthClient().Watch(sctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	// The header comes with the first answer.
	resp, err := stream.Recv()
	if err != nil {
		return false, err
	}
	md, err := stream.Header()
	if err != nil {
		return false, err
	}
	var id string
	if v := md.Get(client.InstanceIDHeader); len(v) > 0 {
		id = v[0]
	}
	a.sawInstance(id, "health watch", reconnect)
	serving := false
	for {
		if st := resp.GetStatus(); st == healthpb.HealthCheckResponse_SERVING {
			serving = true
		} else if serving {
			// Not a restart (yet), but what vipd holds is in doubt.
			serving = false
			a.log.Info("vipd stopped serving; a full sync follows once it serves again", "health", st)
			a.markFull("vipd stopped serving")
		}
		if resp, err = stream.Recv(); err != nil {
			return true, err
		}
	}
}
