package server_test

import (
	"testing"

	"github.com/vipd/vipd/internal/testkit/testserver"
)

// TestShutdownRacingServe stops vipd right after it starts, many times:
// a Shutdown that comes before, during or after the gRPC server begins to
// serve must stop it cleanly, never with an accept error on a listener it
// closed itself (FuzzAPI, which starts and stops a vipd per input, found
// that race).
func TestShutdownRacingServe(t *testing.T) {
	for i := range 200 {
		srv, err := testserver.New(testserver.WithoutWaiting())
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Close(); err != nil {
			t.Fatalf("start and stop %d: %v", i, err)
		}
	}
}
