package kubeadapter

// vipd's health: a pass waits for vipd to serve, and a vipd that stops
// serving or restarts makes the next pass a full sync.

import (
	"context"
	"fmt"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// waitVIPD waits for vipd to serve. A vipd that answers but stays not
// serving (vipd --recover holds its dataplane until a SyncServices) is
// synced all the same: the SyncServices is what it waits for.
func (a *Adapter) waitVIPD(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, a.cfg.servingWait)
	err := a.vipd.WaitServing(wctx)
	cancel()
	if err == nil || ctx.Err() != nil {
		return err
	}
	st, serr := a.vipd.Status(ctx)
	if serr != nil {
		return fmt.Errorf("wait for vipd: %w", err)
	}
	a.log.Warn("vipd answers but is not serving; syncing anyway (a SyncServices ends a --recover hold)", "reason", st.GetLastError())
	return nil
}

// watchVIPD follows vipd's health with a Watch stream: when vipd stops
// serving or the stream breaks (vipd restarted, or lost its state), the
// next pass is a full sync.
func (a *Adapter) watchVIPD(ctx context.Context) {
	backoff := a.cfg.backoffMin
	serving := false
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		stream, err := a.vipd.HealthClient().Watch(sctx, &healthpb.HealthCheckRequest{})
		for err == nil {
			var resp *healthpb.HealthCheckResponse
			if resp, err = stream.Recv(); err != nil {
				break
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				err = fmt.Errorf("vipd health is %v", resp.GetStatus())
				break
			}
			serving, backoff = true, a.cfg.backoffMin
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if serving {
			serving = false
			a.log.Info("vipd stopped serving; a full sync follows once it is back", "error", err)
			a.markFull("vipd reconnected")
		}
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
