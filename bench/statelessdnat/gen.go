package statelessdnat

// The BPF object is generated and committed, so building the benchmark
// needs no clang. `make generate` reruns this; it needs clang, llvm-strip
// and libbpf's headers (Debian: clang llvm libbpf-dev).
//
//go:generate go tool -modfile=../../tools/go.mod bpf2go -cc clang -strip llvm-strip -cflags "-O2 -mcpu=v3 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types dnat bpf/dnat.c
