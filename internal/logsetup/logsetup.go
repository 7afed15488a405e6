// Package logsetup builds a command's root hclog.Logger from its
// --log-level and --log-json flags, so that every vipd binary logs alike.
// It owns that one constructor; loggers are passed on from there, never
// kept globally.
package logsetup

import (
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
)

// New returns the root logger of command name, writing to standard error
// at level (trace, debug, info, warn or error), as JSON lines when asJSON.
// An unknown level is an error that names the --log-level flag.
func New(name, level string, asJSON bool) (hclog.Logger, error) {
	l := hclog.LevelFromString(level)
	if l == hclog.NoLevel {
		return nil, fmt.Errorf("--log-level %q: use trace, debug, info, warn or error", level)
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: l, JSONFormat: asJSON, Output: os.Stderr}), nil
}
