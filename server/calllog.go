package server

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"path"
	"time"

	"github.com/hashicorp/go-hclog"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/authz"
	"github.com/vipd/vipd/server/validation"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// syncNamesLogged bounds the service names a SyncServices log line lists.
const syncNamesLogged = 10

// callLogger logs every call once, when it ends: a change (UpsertService,
// DeleteService, SyncServices, SyncServicesStream, UpdateBackends) at info level, with its
// caller, the owner and service names, validate_only when set, and the
// outcome code; every other call (reads, health, reflection) at debug
// level. Calls that fail in a way that is vipd's fault log at error level.
// Bodies are never logged; the names come from the request, and so does
// the owner where the request gives one (SyncServices' as given, even
// empty); otherwise it is the stored service's, as the call finds it, or
// for an upsert of a service not stored yet validation.DefaultOwner.
type callLogger struct {
	log     hclog.Logger
	ownerOf func(name string) (string, bool)
}

func (l *callLogger) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	fields, change := l.requestFields(req)
	resp, err := handler(ctx, req)
	l.logCall(ctx, info.FullMethod, change, fields, start, err)
	return resp, err
}

func (l *callLogger) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	if info.FullMethod == vipdv1.LoadBalancerService_SyncServicesStream_FullMethodName {
		// A change: logged as SyncServices is, from what its chunks said.
		sf := &syncStreamFields{ServerStream: ss}
		err := handler(srv, sf)
		fields := []any{"owner", sf.owner, "services", sf.services, "chunks", sf.chunks}
		l.logCall(ss.Context(), info.FullMethod, true, withValidateOnly(fields, sf.validateOnly), start, err)
		return err
	}
	err := handler(srv, ss)
	l.logCall(ss.Context(), info.FullMethod, false, nil, start, err)
	return err
}

// syncStreamFields notes, as a SyncServicesStream's chunks arrive, what
// its log line says: the first chunk's owner and validate_only, and how
// many chunks and services came.
type syncStreamFields struct {
	grpc.ServerStream
	owner            string
	validateOnly     bool
	chunks, services int
}

func (s *syncStreamFields) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if c, ok := m.(*syncChunk); ok && err == nil {
		if s.chunks == 0 {
			s.owner, s.validateOnly = c.head.GetOwner(), c.head.GetValidateOnly()
		}
		s.chunks++
		s.services += len(c.services)
	}
	return err
}

func (l *callLogger) logCall(ctx context.Context, fullMethod string, change bool, fields []any, start time.Time, err error) {
	code := status.Code(err)
	all := append([]any{"method", path.Base(fullMethod)}, callerFields(ctx)...)
	all = append(all, fields...)
	all = append(all, "code", code.String(), "elapsed", time.Since(start).Round(time.Microsecond))
	if err != nil {
		all = append(all, "error", status.Convert(err).Message())
	}
	switch {
	case serverFault(code):
		l.log.Error("call", all...)
	case change:
		l.log.Info("call", all...)
	default:
		l.log.Debug("call", all...)
	}
}

// requestFields returns the log fields of a change's request, and whether
// it is a change at all.
func (l *callLogger) requestFields(req any) (fields []any, change bool) {
	switch r := req.(type) {
	case *vipdv1.UpsertServiceRequest:
		// Without an owner, an upsert keeps the stored one, and only a
		// new service gets the default.
		owner := r.GetService().GetOwner()
		if owner == "" {
			owner = cmp.Or(l.owner(r.GetService().GetName()), validation.DefaultOwner)
		}
		fields = []any{"owner", owner, "service", r.GetService().GetName()}
		if r.GetTakeOwnership() {
			fields = append(fields, "take_ownership", true)
		}
		return withValidateOnly(fields, r.GetValidateOnly()), true
	case *vipdv1.DeleteServiceRequest:
		return []any{"owner", l.owner(r.GetName()), "service", r.GetName()}, true
	case *vipdv1.UpdateBackendsRequest:
		return withValidateOnly([]any{"owner", l.owner(r.GetName()), "service", r.GetName()}, r.GetValidateOnly()), true
	case *vipdv1.SyncServicesRequest:
		names := make([]string, 0, min(len(r.GetServices()), syncNamesLogged+1))
		for i, s := range r.GetServices() {
			if i == syncNamesLogged {
				names = append(names, fmt.Sprintf("… %d more", len(r.GetServices())-i))
				break
			}
			names = append(names, s.GetName())
		}
		// As given: SyncServices has no default owner, and refuses none.
		fields = []any{"owner", r.GetOwner(), "services", len(r.GetServices()), "names", names}
		return withValidateOnly(fields, r.GetValidateOnly()), true
	}
	return nil, false
}

func withValidateOnly(fields []any, validateOnly bool) []any {
	if validateOnly {
		return append(fields, "validate_only", true)
	}
	return fields
}

// owner is the stored owner of the service named name, or "" if there is
// none (yet).
func (l *callLogger) owner(name string) string {
	if l.ownerOf == nil {
		return ""
	}
	owner, _ := l.ownerOf(name)
	return owner
}

// callerFields names a call's client: the uid and pid of a Unix-socket
// client (SO_PEERCRED), the certificate identity (the authz.Principal in
// ctx) and address of a TLS client, the address of a plaintext TCP client.
func callerFields(ctx context.Context) []any {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	switch info := p.AuthInfo.(type) {
	case credentials.TLSInfo:
		// The principal that Server attached before this interceptor.
		id := ""
		if pr := authz.FromContext(ctx); pr != nil {
			id = pr.Identity
		}
		return []any{"identity", id, "peer", p.Addr.String()}
	case localAuthInfo:
		if info.cred != nil {
			return []any{"uid", info.cred.Uid, "pid", info.cred.Pid}
		}
		return []any{"peer", "local"}
	}
	return []any{"peer", p.Addr.String()}
}

// peerCred returns the credentials of the process at the other end of a
// Unix socket connection, or nil for any other connection.
func peerCred(c net.Conn) *unix.Ucred {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	return cred
}

// serverFault reports whether a call that ended with c failed through
// vipd's fault rather than the client's.
func serverFault(c codes.Code) bool {
	switch c {
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unavailable:
		return true
	}
	return false
}

// ownerOf is the owner of the stored service named name.
func (a *API) ownerOf(name string) (string, bool) {
	e, ok := a.rec.Snapshot().Get(name)
	if !ok {
		return "", false
	}
	return e.Dataplane.Owner, true
}
