package iptables_test

import (
	"testing"
)

// TestRenderGoldenInKernel: every golden state, rendered in full, is
// accepted as is by the kernel model, which then holds exactly the rendered
// chains. (TestRenderGolden checks the rendered text against the goldens.)
func TestRenderGoldenInKernel(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			rs := mustRender(t, tc.state, tc.opts)
			for _, f := range families {
				assertKernel(t, tracer(t, tc.state, tc.opts, f), rs, f)
			}
		})
	}
}
