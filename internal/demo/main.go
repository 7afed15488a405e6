// Command demo shows vipd working for real: it builds a throwaway netlab
// topology (a node namespace, a client pod and three backend pods), runs
// vipd with the iptables dataplane against the node namespace, configures it
// with vipctl and grpcurl, sends requests through the VIP, shows the
// conntrack entries behind them and a REJECT for a service without
// backends, and removes everything on the way out, also on Ctrl-C.
//
// It is run by `make demo` with the binaries in bin/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vipd/vipd/internal/netlab"
)

func main() {
	bin := flag.String("bin", "bin", "directory with the vipd, vipctl and grpcurl binaries")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *bin); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

const (
	vip      = "198.19.0.10"
	emptyVIP = "198.19.0.11"
)

type demo struct {
	bin, socket string
	lab         *netlab.Lab
}

func step(format string, args ...any) {
	fmt.Printf("\n\033[1m== %s\033[0m\n", fmt.Sprintf(format, args...))
}

// show runs a command, printing it and its output.
func (d *demo) show(ctx context.Context, name string, args ...string) error {
	fmt.Printf("$ %s %s\n", filepath.Base(name), strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
	return cmd.Run()
}

func (d *demo) vipctl(ctx context.Context, args ...string) error {
	return d.show(ctx, filepath.Join(d.bin, "vipctl"), append([]string{"--socket", d.socket}, args...)...)
}

func run(ctx context.Context, bin string) error {
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "vipd-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	step("build a node namespace with a client pod and three backend pods")
	lab, err := netlab.Build(ctx, netlab.Spec{Nodes: []netlab.NodeSpec{{Pods: []string{"client", "web1", "web2", "web3"}}}}, hclog.NewNullLogger())
	if err != nil {
		return err
	}
	defer func() {
		step("clean up: stop vipd, remove its rules and the namespaces")
		if err := lab.Close(); err != nil {
			fmt.Println("cleanup:", err)
		}
	}()
	node := lab.Node(1)
	for _, p := range node.Pods() {
		fmt.Printf("  %-7s %-15s %s\n", p.PodName(), p.IPv4(), p.Name())
		if p.PodName() != "client" {
			if _, err := p.StartEcho("", 8080); err != nil {
				return err
			}
		}
	}

	d := &demo{bin: bin, socket: filepath.Join(work, "vipd.sock"), lab: lab}
	step("start vipd with the iptables dataplane, programming %s", node.Name())
	logPath := filepath.Join(work, "vipd.log")
	vipdArgs := []string{"run", "--dataplane", "iptables", "--netns", node.Path(),
		"--socket", d.socket, "--state-dir", filepath.Join(work, "state")}
	vipd, err := d.startVipd(ctx, logPath, vipdArgs)
	if err != nil {
		return err
	}
	defer func() {
		vipd.Process.Signal(syscall.SIGTERM)
		vipd.Wait()
		exec.Command(filepath.Join(bin, "vipd"), "cleanup", "--netns", node.Path()).Run()
	}()

	step("upsert default/web (%s:80 → three backends on 8080) with vipctl", vip)
	manifest := filepath.Join(work, "web.yaml")
	yaml := fmt.Sprintf("name: default/web\nvips: [%s]\nports:\n- {name: http, port: 80, target_port: 8080}\nbackends:\n", vip)
	for _, p := range []string{"web1", "web2", "web3"} {
		yaml += fmt.Sprintf("- {ip: %s}\n", lab.Pod(p).IPv4())
	}
	if err := os.WriteFile(manifest, []byte(yaml), 0o644); err != nil {
		return err
	}
	fmt.Print(yaml)
	if err := d.vipctl(ctx, "apply", "-f", manifest); err != nil {
		return err
	}

	step("upsert default/empty (%s:80, no backends) with grpcurl", emptyVIP)
	body := fmt.Sprintf(`{"service": {"name": "default/empty", "vips": ["%s"], "ports": [{"port": 80}]}}`, emptyVIP)
	if err := d.show(ctx, filepath.Join(bin, "grpcurl"), "-plaintext", "-d", body, "-unix", d.socket, "vipd.v1.LoadBalancerService/UpsertService"); err != nil {
		return err
	}
	if err := d.vipctl(ctx, "service", "list"); err != nil {
		return err
	}
	if err := d.vipctl(ctx, "service", "get", "default/web"); err != nil {
		return err
	}
	if err := d.vipctl(ctx, "status"); err != nil {
		return err
	}

	client := lab.Pod("client")
	step("30 TCP requests from the client pod (%s) to %s:80", client.IPv4(), vip)
	hits := map[string]int{}
	for i := 1; i <= 30; i++ {
		r, err := client.Request(ctx, "tcp", vip+":80")
		if err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		hits[r.Backend]++
		fmt.Printf("  %2d  client %-21s → VIP %s → %s (backend saw %s)\n", i, r.Local, r.Remote, r.Backend, r.Peer)
	}
	names := make([]string, 0, len(hits))
	for n := range hits {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("  %s answered %d of 30\n", n, hits[n])
	}

	step("the conntrack entries behind them: DNAT to a backend, replies translated back")
	out, err := node.Exec(ctx, "conntrack", "-L", "-d", vip)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	fmt.Printf("$ conntrack -L -d %s   (in %s; %d entries, first 5)\n", vip, node.Name(), len(lines))
	for _, l := range lines[:min(5, len(lines))] {
		fmt.Println("  " + l)
	}

	step("a service without backends is rejected at once, not left to hang")
	start := time.Now()
	_, err = client.Request(ctx, "tcp", emptyVIP+":80")
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		fmt.Printf("  connect %s:80: connection refused after %v\n", emptyVIP, time.Since(start).Round(time.Microsecond))
	default:
		return fmt.Errorf("connect to the empty service: want connection refused, got %v", err)
	}
	step("kill -9 vipd: traffic keeps flowing, because the rules live in the kernel")
	vipd.Process.Kill()
	vipd.Wait()
	for i := 1; i <= 5; i++ {
		r, err := client.Request(ctx, "tcp", vip+":80")
		if err != nil {
			return fmt.Errorf("request %d with vipd down: %w", i, err)
		}
		fmt.Printf("  vipd down, request %d → %s\n", i, r.Backend)
	}
	step("restart vipd with the same state dir: it finds its rules in place and rewrites nothing")
	if vipd, err = d.startVipd(ctx, logPath, vipdArgs); err != nil {
		return err
	}
	if err := d.vipctl(ctx, "service", "list"); err != nil {
		return err
	}

	step("the rules vipd wrote for it (iptables-save | grep %s)", emptyVIP)
	save, err := node.Exec(ctx, "iptables-save")
	if err != nil {
		return err
	}
	for l := range strings.Lines(save) {
		if strings.Contains(l, emptyVIP) || strings.Contains(l, vip+"/32") {
			fmt.Print("  " + l)
		}
	}
	return nil
}

// startVipd starts vipd with args, appending its output to logPath, and
// waits until it reports ready.
func (d *demo) startVipd(ctx context.Context, logPath string, args []string) (*exec.Cmd, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(d.bin, "vipd"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := d.waitReady(ctx); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		log, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	return cmd, nil
}

func (d *demo) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		out, err := exec.CommandContext(ctx, filepath.Join(d.bin, "grpcurl"), "-plaintext", "-unix", d.socket, "grpc.health.v1.Health/Check").Output()
		if err == nil && strings.Contains(string(out), `"SERVING"`) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("vipd did not become ready")
}
