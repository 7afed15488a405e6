package logsetup_test

import (
	"strings"
	"testing"

	"github.com/vipd/vipd/internal/logsetup"
)

func TestNew(t *testing.T) {
	for _, level := range []string{"trace", "debug", "info", "warn", "error", "INFO"} {
		if log, err := logsetup.New("x", level, false); err != nil || log.Name() != "x" {
			t.Errorf("level %q: %v %v", level, log, err)
		}
	}
	if log, err := logsetup.New("x", "warn", true); err != nil || !log.IsWarn() || log.IsInfo() {
		t.Errorf("warn: %v %v; want warn and above only", log, err)
	}
	for _, level := range []string{"", "loud", "5"} {
		if _, err := logsetup.New("x", level, false); err == nil || !strings.Contains(err.Error(), "--log-level") {
			t.Errorf("level %q: %v; want an error naming --log-level", level, err)
		}
	}
}
