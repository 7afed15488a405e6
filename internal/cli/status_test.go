package cli

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	vipdv1 "github.com/vipd/vipd/proto/vipd/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestStatusWarningsView checks the "Warnings:" block of vipctl status:
// each warning's check, message, since and remedy, after the key/value
// lines, which keep their layout.
func TestStatusWarningsView(t *testing.T) {
	st := &vipdv1.GetStatusResponse{
		Dataplane:  "iptables",
		Ready:      true,
		NodeName:   "node-1",
		Zone:       "zone-b",
		ZoneSource: "api",
		Warnings: []*vipdv1.StatusWarning{
			{
				Check:   "sysctl/net.ipv4.ip_forward",
				Message: "net.ipv4.ip_forward is 0, want 1: the node does not forward IPv4",
				Remedy:  "sysctl -w net.ipv4.ip_forward=1",
				Since:   timestamppb.New(time.Date(2026, 12, 3, 16, 0, 0, 0, time.UTC)),
			},
			{Check: "route/ipv4", Message: "1 VIP has no usable route: 198.19.0.10 (no route)"},
		},
	}
	var out bytes.Buffer
	if err := (printer{w: &out, format: outputTable}).show(st, statusView(st)); err != nil {
		t.Fatal(err)
	}
	want := `Dataplane:           iptables
Version:             -
Instance ID:         -
Ready:               true
Node:                node-1
Zone:                zone-b (set through the API)
Services:            0
Backends:            0
Applied generation:  0
Last sync:           never
Last error:          -
Load balancing:      -
Protocols:           -
Warnings:
  sysctl/net.ipv4.ip_forward: net.ipv4.ip_forward is 0, want 1: the node does not forward IPv4 (since 2026-12-03T16:00:00Z)
    fix: sysctl -w net.ipv4.ip_forward=1
  route/ipv4: 1 VIP has no usable route: 198.19.0.10 (no route)
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
}
