package ebpf

// The BPF objects are generated and committed, so building vipd needs no
// clang. `make generate` reruns this; it needs clang, llvm-strip and
// libbpf's headers (Debian: clang llvm libbpf-dev).
//
//go:generate go tool -modfile=../../tools/go.mod bpf2go -cc clang -strip llvm-strip -cflags "-O2 -mcpu=v3 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types -type svc_key -type svc_val -type backend -type member_key -type rev_nat -type ct_key -type ct_entry -type affinity_key -type affinity_val -type sock_key -type sock_val -type sock_udp_key -type sock_udp_val -type config -type flow_event -type src_range_key -type ext_iface -type snat_tw bpf bpf/vipd.c
