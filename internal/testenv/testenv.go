// Package testenv holds what the tests of every package share: the rule for
// a missing server (fail in CI, skip elsewhere) and whether Docker works and
// can run a given image.
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

// DockerSetUp reports whether the test script set up the Docker engine
// (.ci/docker.sh exports LEADERFEED_DOCKER=1). Containers of the images it
// built must then start: a test that cannot start one fails rather than
// skips. No registry is reachable there, so no image is pulled.
func DockerSetUp() bool { return os.Getenv("LEADERFEED_DOCKER") == "1" }

// DockerCanRun reports whether a container of image can be started: Docker
// works, and either the image is on the machine or it can be pulled (it is
// assumed it can, except where DockerSetUp says no registry is reachable).
func DockerCanRun(image string) bool {
	if !DockerWorks() {
		return false
	}
	if !DockerSetUp() {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "docker", "image", "inspect", image).Run() == nil
}
