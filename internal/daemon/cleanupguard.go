package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/client"
	"github.com/vipd/vipd/server/store"
)

// SocketInUseError says that a vipd answers health checks on a socket.
type SocketInUseError struct {
	// Socket is the API socket's path.
	Socket string
}

func (e *SocketInUseError) Error() string {
	return fmt.Sprintf("a running vipd answers on its API socket %s", e.Socket)
}

// socketProbeTimeout bounds the health check of GuardCleanup.
const socketProbeTimeout = time.Second

// GuardCleanup tells whether a vipd runs whose rules a cleanup would
// remove. It takes the lock of stateDir (see LockStateDir), and, since a
// vipd started with another state directory holds another lock, it also
// asks the API socket for vipd's health, with a short timeout: an answer
// of any status means a vipd serves there. It logs when stateDir has no
// lock file, since that is also what a --state-dir that is not vipd's
// looks like.
//
// When no vipd is found, the error is nil and release frees the lock.
// Otherwise the error is a *StateDirInUseError or a *SocketInUseError, and
// release, never nil then, frees whatever was taken; other errors come with
// a nil release.
func GuardCleanup(ctx context.Context, log hclog.Logger, stateDir, socket string) (release func(), err error) {
	if _, err := os.Stat(store.LockPath(stateDir)); errors.Is(err, fs.ErrNotExist) {
		log.Warn("no vipd lock file in the state dir: either no vipd has run with it, or vipd runs with another --state-dir "+
			"(VIPD_STATE_DIR); only the API socket is checked then", "path", store.LockPath(stateDir))
	}
	release, err = LockStateDir(stateDir)
	var inUse *StateDirInUseError
	switch {
	case errors.As(err, &inUse):
		return func() {}, err
	case err != nil:
		return nil, err
	}
	if socket == "" {
		return release, nil
	}
	if _, err := os.Stat(socket); errors.Is(err, fs.ErrNotExist) {
		return release, nil
	}
	c, err := client.New(socket, client.WithMaxAttempts(1))
	if err != nil {
		release()
		return nil, fmt.Errorf("check the API socket %s: %w", socket, err)
	}
	defer c.Close()
	hctx, cancel := context.WithTimeout(ctx, socketProbeTimeout)
	defer cancel()
	if _, err := c.Health(hctx); err != nil {
		log.Debug("no vipd answers on the API socket", "socket", socket, "error", err)
		return release, nil
	}
	return release, &SocketInUseError{Socket: socket}
}
