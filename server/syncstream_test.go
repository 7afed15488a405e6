package server_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server"
)

// syncStream sends chunks on one SyncServicesStream and returns its answer.
func syncStream(ctx context.Context, in *instance, chunks ...*vipdv1.SyncServicesStreamRequest) (*vipdv1.SyncServicesStreamResponse, error) {
	stream, err := in.lb.SyncServicesStream(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range chunks {
		if err := stream.Send(c); err != nil {
			break // the server ended the call: CloseAndRecv says why
		}
	}
	return stream.CloseAndRecv()
}

func chunkOf(owner string, svcs ...*vipdv1.Service) *vipdv1.SyncServicesStreamRequest {
	return &vipdv1.SyncServicesStreamRequest{Owner: owner, Services: svcs}
}

// listed returns the names of owner's services as stored.
func listed(t *testing.T, in *instance, owner string) []string {
	t.Helper()
	resp, err := in.lb.ListServices(ctxT(t), &vipdv1.ListServicesRequest{Owner: owner})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.Services {
		names = append(names, s.Name)
	}
	return names
}

// TestSyncServicesStreamChunks: the services of every chunk together are
// the list, synced as one SyncServices: created, updated, deleted and
// unchanged as one call would, in one apply.
func TestSyncServicesStreamChunks(t *testing.T) {
	in := start(t, config{})
	resp, err := syncStream(ctxT(t), in,
		chunkOf("k8s", web("k8s/a", "198.19.0.1"), web("k8s/b", "198.19.0.2")),
		chunkOf("", web("k8s/c", "198.19.0.3")),
		chunkOf("k8s"), // empty chunks, and the owner repeated, are fine
		chunkOf("k8s", web("k8s/d", "198.19.0.4", "198.18.1.10")))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"k8s/a", "k8s/b", "k8s/c", "k8s/d"}
	if !slices.Equal(resp.Created, want) {
		t.Fatalf("created %v, want %v", resp.Created, want)
	}
	if got := appliedNames(in); !slices.Equal(got, want) {
		t.Fatalf("dataplane has %v, want %v", got, want)
	}

	records := len(in.dp.Records())
	resp, err = syncStream(ctxT(t), in,
		chunkOf("k8s", web("k8s/a", "198.19.0.1")),
		chunkOf("", web("k8s/c", "198.19.0.30"), web("k8s/e", "198.19.0.5")))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.Created, []string{"k8s/e"}) || !slices.Equal(resp.Updated, []string{"k8s/c"}) ||
		!slices.Equal(resp.Deleted, []string{"k8s/b", "k8s/d"}) || !slices.Equal(resp.Unchanged, []string{"k8s/a"}) {
		t.Fatalf("second stream: %v", resp)
	}
	if n := len(in.dp.Records()) - records; n != 1 {
		t.Errorf("the stream took %d applies, want 1", n)
	}
	if got := listed(t, in, "k8s"); !slices.Equal(got, []string{"k8s/a", "k8s/c", "k8s/e"}) {
		t.Errorf("stored %v", got)
	}
}

// TestSyncServicesStreamBadChunkChangesNothing: a chunk that does not
// validate fails the whole stream, naming the field by its place in the
// whole list, and nothing changes; so does a later chunk naming another
// owner, or setting validate_only alone.
func TestSyncServicesStreamBadChunkChangesNothing(t *testing.T) {
	in := start(t, config{})
	if _, err := syncStream(ctxT(t), in, chunkOf("k8s", web("k8s/a", "198.19.0.1"))); err != nil {
		t.Fatal(err)
	}
	records := len(in.dp.Records())

	bad := web("k8s/bad", "not-an-ip")
	_, err := syncStream(ctxT(t), in,
		chunkOf("k8s", web("k8s/b", "198.19.0.2"), web("k8s/c", "198.19.0.3")),
		chunkOf("", web("k8s/d", "198.19.0.4"), bad))
	wantCode(t, err, codes.InvalidArgument)
	if f := fieldsOf(err); !slices.Contains(f, "services[3].vips[0]") {
		t.Errorf("violations name %v, want services[3].vips[0] (the 4th service of the stream)", f)
	}

	_, err = syncStream(ctxT(t), in, chunkOf("k8s", web("k8s/b", "198.19.0.2")), chunkOf("other", web("k8s/c", "198.19.0.3")))
	wantCode(t, err, codes.InvalidArgument)
	if f := fieldsOf(err); !slices.Equal(f, []string{"owner"}) {
		t.Errorf("a chunk of another owner: violations %v, want owner", f)
	}
	later := chunkOf("", web("k8s/c", "198.19.0.3"))
	later.ValidateOnly = true
	_, err = syncStream(ctxT(t), in, chunkOf("k8s", web("k8s/b", "198.19.0.2")), later)
	wantCode(t, err, codes.InvalidArgument)
	if f := fieldsOf(err); !slices.Equal(f, []string{"validate_only"}) {
		t.Errorf("validate_only set by a later chunk: violations %v, want validate_only", f)
	}
	_, err = syncStream(ctxT(t), in)
	wantCode(t, err, codes.InvalidArgument)

	// A validate_only stream reports and changes nothing.
	first := chunkOf("k8s", web("k8s/b", "198.19.0.2"))
	first.ValidateOnly = true
	resp, err := syncStream(ctxT(t), in, first, chunkOf("", web("k8s/c", "198.19.0.3")))
	if err != nil || !slices.Equal(resp.Created, []string{"k8s/b", "k8s/c"}) || !slices.Equal(resp.Deleted, []string{"k8s/a"}) {
		t.Fatalf("validate_only stream: %v, %v", resp, err)
	}

	if n := len(in.dp.Records()); n != records {
		t.Errorf("%d applies after refused streams, want %d", n, records)
	}
	if got := listed(t, in, "k8s"); !slices.Equal(got, []string{"k8s/a"}) {
		t.Errorf("stored %v, want k8s/a alone", got)
	}
}

// TestSyncServicesStreamDroppedChangesNothing: a stream the client
// abandons before closing its side changes nothing, even if every chunk it
// sent was valid.
func TestSyncServicesStreamDroppedChangesNothing(t *testing.T) {
	in := start(t, config{})
	if _, err := syncStream(ctxT(t), in, chunkOf("k8s", web("k8s/a", "198.19.0.1"))); err != nil {
		t.Fatal(err)
	}
	records := len(in.dp.Records())

	ctx, cancel := context.WithCancel(ctxT(t))
	stream, err := in.lb.SyncServicesStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(chunkOf("k8s", web("k8s/b", "198.19.0.2"))); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(chunkOf("", web("k8s/c", "198.19.0.3"))); err != nil {
		t.Fatal(err)
	}
	cancel()
	// RecvMsg, not CloseAndRecv: the client never closes its side. A
	// CloseSend right after cancel can still reach vipd before the
	// cancellation does (gRPC acts on a cancelled context asynchronously),
	// and vipd then rightly syncs a stream that the client completed.
	if err := stream.RecvMsg(new(vipdv1.SyncServicesStreamResponse)); err == nil {
		t.Fatal("a cancelled stream succeeded")
	}
	// Had the server synced what it got, the list would show it soon: the
	// call's apply is all it waits for.
	for range 20 {
		if got := listed(t, in, "k8s"); !slices.Equal(got, []string{"k8s/a"}) {
			t.Fatalf("stored %v after a dropped stream, want k8s/a alone", got)
		}
		time.Sleep(25 * time.Millisecond)
	}
	if n := len(in.dp.Records()); n != records {
		t.Errorf("%d applies after a dropped stream, want %d", n, records)
	}
}

// TestSyncServicesStreamBrokenChangesNothing: a stream that breaks off on
// the server's side (here a chunk over the message size limit), while the
// call's context lives on, changes nothing either.
func TestSyncServicesStreamBrokenChangesNothing(t *testing.T) {
	in := start(t, config{serverOps: []server.Option{server.WithMaxRecvMsgSize(4096)}})
	if _, err := syncStream(ctxT(t), in, chunkOf("k8s", web("k8s/a", "198.19.0.1"))); err != nil {
		t.Fatal(err)
	}
	records := len(in.dp.Records())
	huge := web("k8s/huge", "198.19.0.9")
	for i := range 400 {
		huge.Backends = append(huge.Backends, &vipdv1.Backend{Ip: fmt.Sprintf("198.18.%d.%d", i/200, i%200+1)})
	}
	_, err := syncStream(ctxT(t), in, chunkOf("k8s", web("k8s/b", "198.19.0.2")), chunkOf("", huge))
	wantCode(t, err, codes.ResourceExhausted)
	if got := listed(t, in, "k8s"); !slices.Equal(got, []string{"k8s/a"}) {
		t.Fatalf("stored %v after a broken stream, want k8s/a alone", got)
	}
	if n := len(in.dp.Records()); n != records {
		t.Errorf("%d applies after a broken stream, want %d", n, records)
	}
}
