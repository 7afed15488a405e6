package server

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"github.com/vipd/vipd/server/store"
)

// syncChunk is one SyncServicesStreamRequest as received: its owner and
// validate_only decoded, its services still encoded. SyncServicesStream
// decodes them one by one with a store.ServiceDecoder, into messages that
// it reuses from service to service and chunk to chunk, rather than have
// gRPC decode every chunk into messages of its own: a sync of 100,000
// services × 10 backends made, and dropped, over a million messages.
//
// A syncChunk is received with the codec of codec(), which the server
// installs; the zero value is ready to receive into, and one chunk is
// reused for the whole stream.
type syncChunk struct {
	// head is the chunk without its services.
	head vipdv1.SyncServicesStreamRequest
	// services is the encoding of each service, in the chunk's order:
	// slices of buf, valid until the next chunk is received.
	services [][]byte
	buf      []byte
	rest     []byte
}

// servicesField is the field number of SyncServicesStreamRequest.services.
const servicesField = 2

// decode decodes data, a SyncServicesStreamRequest's encoding, into c, as
// proto.Unmarshal would but for the services, which it splits out (see
// store.SplitField).
func (c *syncChunk) decode(data mem.BufferSlice) error {
	c.buf = c.buf[:0]
	for _, b := range data {
		c.buf = append(c.buf, b.ReadOnlyData()...)
	}
	services := c.services[:0]
	rest, err := store.SplitField(c.rest[:0], c.buf, servicesField, func(_, v []byte) error {
		services = append(services, v)
		return nil
	})
	c.rest, c.services = rest, services
	if err != nil {
		return err
	}
	return proto.Unmarshal(rest, &c.head)
}

// malformed is the error of a chunk whose service does not decode: what
// gRPC answers for a message that does not decode.
func malformed(err error) error {
	return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
}

// chunkCodec is gRPC's proto codec, but for a syncChunk, which it decodes
// with syncChunk.decode.
type chunkCodec struct{ encoding.CodecV2 }

// codec returns the codec that the server's gRPC server uses: see
// chunkCodec.
func codec() encoding.CodecV2 {
	return chunkCodec{encoding.GetCodecV2(grpcproto.Name)}
}

func (c chunkCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if chunk, ok := v.(*syncChunk); ok {
		if err := chunk.decode(data); err != nil {
			return fmt.Errorf("decode %T: %w", &chunk.head, err)
		}
		return nil
	}
	return c.CodecV2.Unmarshal(data, v)
}
