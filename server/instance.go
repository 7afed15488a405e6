package server

// vipd's instance ID: a random name for this run of the daemon, so that a
// client can tell a restarted vipd (which may have come back without its
// state) from the one it wrote to.

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// InstanceIDHeader is the response header metadata key in which the
// health service (grpc.health.v1.Health, Check and Watch) sends the
// instance ID, the GetStatusResponse.instance_id of the same run.
const InstanceIDHeader = "vipd-instance-id"

// newInstanceID returns 128 random bits as 32 lowercase hex digits. Two
// starts never draw the same one in practice, so an ID is never reused.
func newInstanceID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error)
	return hex.EncodeToString(b[:])
}

// InstanceID identifies the API's run: drawn by NewAPI, so a vipd that
// restarts (and builds a new API) has another one. GetStatus reports it,
// and the Server built over the API sends it with every health answer.
func (a *API) InstanceID() string { return a.instance }

// instanceHeader returns interceptors that put id in the response header
// of the health service's calls: with Check's answer, and with the first
// message of a Watch stream, so that a watcher learns which vipd it
// watches on every (re)connect. Other calls are left alone.
func instanceHeader(id string) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	md := metadata.Pairs(InstanceIDHeader, id)
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == healthpb.Health_Check_FullMethodName {
			if err := grpc.SetHeader(ctx, md); err != nil {
				return nil, err
			}
		}
		return handler(ctx, req)
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod == healthpb.Health_Watch_FullMethodName {
			if err := ss.SetHeader(md); err != nil {
				return err
			}
		}
		return handler(srv, ss)
	}
	return unary, stream
}
