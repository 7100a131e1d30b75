// Package testenv holds what the tests of every package share: the rule for
// a missing server (fail in CI, skip elsewhere) and whether Docker works.
package testenv

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"
)

// InCI reports whether the tests run in CI (CI=true in the environment).
func InCI() bool { return os.Getenv("CI") == "true" || os.Getenv("CI") == "1" }

// Unavailable is called when a server a test needs cannot be found. In CI it
// fails the test, since CI must provide every server; elsewhere it skips it
// with a one-line reason.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true but %s", reason)
	}
	t.Skipf("skipped: %s", reason)
}

// DockerWorks reports whether a Docker engine answers, so that
// testcontainers-go can start a server. It gives up after two seconds.
func DockerWorks() bool {
	if os.Getenv("LEADERFEED_NO_DOCKER") != "" {
		return false
	}
	if _, err := exec.LookPath("docker"); err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "docker", "info").Run() == nil
}
