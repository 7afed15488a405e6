// Package testbin builds vipd's commands, and the pinned grpcurl, for tests
// and benchmarks that run them as separate processes, as a user would. It
// only builds; starting and stopping the processes stays with each test.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Build builds the given packages of the vipd module (such as "./cmd/vipd")
// into a new temporary directory, and grpcurl too when withGrpcurl is set.
// It returns the directory and a function that removes it.
func Build(withGrpcurl bool, pkgs ...string) (dir string, cleanup func(), err error) {
	root, err := moduleRoot()
	if err != nil {
		return "", nil, err
	}
	dir, err = os.MkdirTemp("", "vipd-testbin")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	builds := [][]string{append([]string{"build", "-o", dir + "/"}, pkgs...)}
	if withGrpcurl {
		builds = append(builds, []string{"build", "-modfile=" + filepath.Join(root, "tools/go.mod"),
			"-o", filepath.Join(dir, "grpcurl"), "github.com/fullstorydev/grpcurl/cmd/grpcurl"})
	}
	for _, args := range builds {
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			cleanup()
			return "", nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	return dir, cleanup, nil
}

// moduleRoot is the directory of the vipd module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the vipd module")
	}
	return filepath.Dir(gomod), nil
}
