package server

import (
	"context"
	"net"
	"slices"
	"testing"

	"github.com/vipd/vipd/server/authz"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// TestCallerFieldsTLSIdentity: a TLS client is logged with the identity
// of the authz.Principal in the call's context, the one its owner checks
// use, not one read from the certificate a second time.
func TestCallerFieldsTLSIdentity(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 4000}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: credentials.TLSInfo{}})
	if got, want := callerFields(ctx), []any{"identity", "", "peer", "192.0.2.1:4000"}; !slices.Equal(got, want) {
		t.Errorf("without a principal: %v; want %v", got, want)
	}
	ctx = authz.NewContext(ctx, authz.NewPrincipal("spiffe://vipd.test/ctrl-a", nil))
	if got, want := callerFields(ctx), []any{"identity", "spiffe://vipd.test/ctrl-a", "peer", "192.0.2.1:4000"}; !slices.Equal(got, want) {
		t.Errorf("with a principal: %v; want %v", got, want)
	}
}
