package kubeadapter

// Writes of one service to vipd that survive another writer: generation
// conflicts are reread and retried a bounded number of times, and a name
// another owner took is left alone.

import (
	"context"
	"fmt"

	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/internal/kubeconvert"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxWriteRaces bounds the rereads of one service's write that met
// another writer.
const maxWriteRaces = 3

// takenError is write's answer for a name that another owner holds.
type takenError struct{ owner string }

func (e *takenError) Error() string { return "owner " + e.owner + " holds it" }

// write makes vipd's service want.Name equal to want: a create when create
// (vipd refuses it if the name exists, whoever owns it), else an update of
// the kubernetes-owned service at generation gen. When another writer got
// in between (the create met an existing name, the update another
// generation), it reads the service again and goes on as what it finds: a
// create when the name is free, an update at its generation when it is
// kubernetes-owned, and a *takenError, without writing, when another owner
// holds it. A create refused while the name is free is a VIP:port conflict
// (unless the name came and went meanwhile: one more create tells). Other
// errors are vipd's status errors.
func (a *Adapter) write(ctx context.Context, want *vipdv1.Service, gen uint64, create bool) (*vipdv1.Service, error) {
	freeBefore := false // a refused create found the name free once
	for race := 0; ; race++ {
		var (
			got *vipdv1.Service
			err error
		)
		if create {
			got, err = a.vipd.CreateService(ctx, want)
		} else {
			got, err = a.vipd.UpsertService(ctx, want, gen)
		}
		code := status.Code(err)
		if race >= maxWriteRaces || !(create && code == codes.AlreadyExists || !create && code == codes.Aborted) {
			return got, err
		}
		cur, gerr := a.vipd.GetService(ctx, want.Name)
		switch {
		case client.IsNotFound(gerr):
			if create && freeBefore {
				return nil, err
			}
			freeBefore = freeBefore || create
			gen, create = 0, true
		case gerr != nil:
			return nil, fmt.Errorf("get after a write conflict: %w", gerr)
		case cur.Owner != kubeconvert.Owner:
			return nil, &takenError{owner: cur.Owner}
		default:
			gen, create = cur.Generation, false
		}
	}
}

// deleteOwned deletes name, which the adapter applied at generation gen,
// unless another owner has taken it over since.
func (a *Adapter) deleteOwned(ctx context.Context, name string, gen uint64) error {
	for try := 0; ; try++ {
		err := a.vipd.DeleteService(ctx, name, gen)
		if err == nil || client.IsNotFound(err) {
			delete(a.applied, name)
			return nil
		}
		if status.Code(err) != codes.Aborted || try > 0 {
			return fmt.Errorf("delete: %w", err)
		}
		cur, gerr := a.vipd.GetService(ctx, name)
		switch {
		case client.IsNotFound(gerr):
			delete(a.applied, name)
			return nil
		case gerr != nil:
			return fmt.Errorf("get after a generation conflict: %w", gerr)
		case cur.Owner != kubeconvert.Owner:
			a.log.Info("service taken over by another owner; not deleting it", "service", name, "owner", cur.Owner)
			delete(a.applied, name)
			return nil
		}
		gen = cur.Generation
	}
}
