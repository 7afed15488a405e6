package load

import (
	_ "embed"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vipd/vipd/internal/testkit/netlab"
)

//go:embed cgen/cgen.c
var cgenSource []byte

// CGen is the cross-check generator: a small C program (cgen/cgen.c) that
// makes the same connections as TCPConnections with ServerCloses, sharing
// no code with it. Its rate beside TCPConnections' in the same run shows
// whether the Go generator costs more than it must.
type CGen struct{ bin string }

// BuildCGen compiles the cross-check generator with gcc into dir.
func BuildCGen(dir string) (*CGen, error) {
	src := filepath.Join(dir, "cgen.c")
	if err := os.WriteFile(src, cgenSource, 0o644); err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "cgen")
	if out, err := exec.Command("gcc", "-O2", "-Wall", "-pthread", "-o", bin, src).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the C generator: %w: %s", err, out)
	}
	return &CGen{bin: bin}, nil
}

// TCPConnections runs the C generator from ns for d, with workers
// connections in flight on one thread per CPU, as TCPConnections does with
// ServerCloses. The Result has no latencies and no backend counts.
func (g *CGen) TCPConnections(ns *netlab.NS, dsts []netip.AddrPort, ports PortRange, workers int, d time.Duration) (Result, error) {
	args := []string{ns.Path(), fmt.Sprint(ports.Lo), fmt.Sprint(ports.Hi), fmt.Sprint(d.Seconds()), fmt.Sprint(workers), fmt.Sprint(min(runtime.NumCPU(), workers))}
	for _, dst := range dsts {
		args = append(args, dst.String())
	}
	out, err := exec.Command(g.bin, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return Result{}, fmt.Errorf("C generator: %w", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 4 || f[0] != "ok" {
		return Result{}, fmt.Errorf("C generator: unexpected output %q", out)
	}
	failed, err1 := strconv.Atoi(f[1])
	secs, err2 := strconv.ParseFloat(f[2], 64)
	ok, err3 := strconv.Atoi(f[3])
	if err := errors.Join(err1, err2, err3); err != nil {
		return Result{}, fmt.Errorf("C generator: output %q: %w", out, err)
	}
	res := Result{OK: ok, Failed: failed, Elapsed: d, Backends: map[string]int{}}
	if failed > 0 {
		res.FirstErr = errors.New("the C generator reports failed connections (it does not say why)")
	}
	_ = secs // includes thread start and namespace entry; the rate is over d, as TCPConnections'
	return res, nil
}
