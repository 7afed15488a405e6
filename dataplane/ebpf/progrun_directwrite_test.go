package ebpf

import (
	"testing"

	"github.com/cilium/ebpf/asm"
)

// The NAT rewrite writes an IPv4 address with its header checksum, and a
// port, in place (FASTPATH.md 11): no helper call but the L4 checksum's.
// Which helpers a program calls is in its text; in vipd_to_pod and
// vipd_to_ext, where rewrite is inlined three times (a reply's source, a
// hairpin or SNAT reply's destination), bpf_l3_csum_replace is left only
// in ttl_decrement and icmp_set_addr (5 calls each before, 2 now). The
// output of every rewrite is checked by the other progrun tests
// (prCheckChecksums, TestProgRunChecksumComplete).
func TestFastPathRewriteWritesInPlace(t *testing.T) {
	spec, err := loadBpf()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	for _, name := range []string{"vipd_to_pod", "vipd_to_ext"} {
		n := 0
		for _, ins := range spec.Programs[name].Instructions {
			if ins.IsBuiltinCall() && asm.BuiltinFunc(ins.Constant) == asm.FnL3CsumReplace {
				n++
			}
		}
		if n > 2 {
			t.Errorf("%s calls bpf_l3_csum_replace %d times, want at most 2 (ttl_decrement, icmp_set_addr): rewrite calls it again", name, n)
		}
	}
}
