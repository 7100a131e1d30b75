// Package containertest runs the test suites of the postgres, mongo and
// rethink modules against servers in containers started by testcontainers-go.
//
// It is a module of its own so that testcontainers-go and the Docker client
// stay out of the backend modules: a service that imports only
// github.com/leaderfeed/leaderfeed/postgres gets no go.sum line for them.
// Each test starts one container, then runs `go test` in the backend's
// module with the server's address in the variable that module's tests read
// (LEADERFEED_POSTGRES_URL, LEADERFEED_MONGO_URL, LEADERFEED_RETHINK_ADDR),
// so the backend's whole suite runs against the container, unchanged.
//
// Where Docker does not work the tests skip with a one-line reason (the
// backend suites then run against the servers scripts/test.sh starts); where
// it works, a container that does not start fails the test. The images can
// be replaced with LEADERFEED_POSTGRES_IMAGE, LEADERFEED_MONGO_IMAGE and
// LEADERFEED_RETHINK_IMAGE.
//
// In CI, .ci/docker.sh starts a Docker engine, builds a PostgreSQL image
// locally (no registry is reachable) and exports LEADERFEED_DOCKER=1 and
// LEADERFEED_POSTGRES_IMAGE: the postgres suite and its example must then
// run in a container, and fail if it does not start. No image of a real
// MongoDB or RethinkDB can be built there, so those two tests skip, by
// design; they run wherever Docker can pull mongo:7 and rethinkdb:2.4.
package containertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcmongo "github.com/testcontainers/testcontainers-go/modules/mongodb"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

// startTimeout bounds the start of one container, image pull included.
const startTimeout = 5 * time.Minute

func image(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// needDocker skips the test where no Docker engine answers or where img
// can be neither found nor pulled (what names the server, for the reason).
// Where the test script set the engine up (LEADERFEED_DOCKER=1) an engine
// that does not answer fails the test.
func needDocker(t *testing.T, img, what string) {
	t.Helper()
	if !testenv.DockerWorks() {
		if testenv.DockerSetUp() || testenv.InCI() {
			t.Fatal("no Docker engine answers `docker info`, in CI or after .ci/docker.sh set one up (LEADERFEED_DOCKER=1)")
		}
		t.Skip("skipped: no Docker engine answers `docker info`; the backend suites ran against the servers scripts/test.sh starts")
	}
	if !testenv.DockerCanRun(img) {
		t.Skipf("skipped, also in CI by design: no image of a real %s can be built on this machine and no registry is reachable to pull %s; the backend suite ran against its stand-in", what, img)
	}
}

// runSuite runs `go test` in the module dir (relative to the repository
// root) with env added, and fails t if that run fails. Its output is logged.
func runSuite(t *testing.T, dir string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	args := []string{"test", "-count=1"}
	if testing.Verbose() {
		args = append(args, "-v")
	}
	args = append(args, "./...")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join("..", dir)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("go test in %s:\n%s", dir, out)
	if err != nil {
		t.Fatalf("go test in %s against the container: %v", dir, err)
	}
}

func terminate(t *testing.T, c testcontainers.Container) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := testcontainers.TerminateContainer(c, testcontainers.StopContext(ctx)); err != nil {
			t.Errorf("terminating the container: %v", err)
		}
	})
}

// TestPostgresSuiteOnContainer runs the postgres module's tests and the
// PostgreSQL example against a container. Where the test script built the
// image (LEADERFEED_DOCKER=1), it must run: it fails rather than skips.
func TestPostgresSuiteOnContainer(t *testing.T) {
	img := image("LEADERFEED_POSTGRES_IMAGE", "postgres:16-alpine")
	if testenv.DockerSetUp() && !testenv.DockerCanRun(img) {
		t.Fatalf("LEADERFEED_DOCKER=1 but the PostgreSQL image %s is not on this machine", img)
	}
	needDocker(t, img, "PostgreSQL")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := tcpostgres.Run(ctx, img,
		tcpostgres.WithDatabase("leaderfeed"),
		tcpostgres.WithUsername("leaderfeed"),
		tcpostgres.WithPassword("leaderfeed"),
		tcpostgres.BasicWaitStrategies(),
	)
	terminate(t, c)
	if err != nil {
		t.Fatalf("starting a %s container: %v", img, err)
	}
	url, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		t.Fatalf("container connection string: %v", err)
	}
	runSuite(t, "postgres", "LEADERFEED_POSTGRES_URL="+url)
	runSuite(t, "examples/postgres", "LEADERFEED_POSTGRES_URL="+url)
}

func TestMongoSuiteOnContainer(t *testing.T) {
	img := image("LEADERFEED_MONGO_IMAGE", "mongo:7")
	needDocker(t, img, "MongoDB")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := tcmongo.Run(ctx, img, tcmongo.WithReplicaSet("rs0"))
	terminate(t, c)
	if err != nil {
		t.Fatalf("starting a %s container: %v", img, err)
	}
	url, err := c.ConnectionString(ctx)
	if err != nil {
		t.Fatalf("container connection string: %v", err)
	}
	// The replica set's member is named by its container host name, which
	// the host cannot resolve: talk to the one node directly.
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	runSuite(t, "mongo", "LEADERFEED_MONGO_URL="+url+sep+"directConnection=true")
}

func TestRethinkSuiteOnContainer(t *testing.T) {
	img := image("LEADERFEED_RETHINK_IMAGE", "rethinkdb:2.4")
	needDocker(t, img, "RethinkDB")
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := testcontainers.Run(ctx, img,
		testcontainers.WithExposedPorts("28015/tcp"),
		testcontainers.WithWaitStrategy(wait.ForListeningPort("28015/tcp")))
	terminate(t, c)
	if err != nil {
		t.Fatalf("starting a %s container: %v", img, err)
	}
	addr, err := c.PortEndpoint(ctx, "28015/tcp", "")
	if err != nil {
		t.Fatalf("container port: %v", err)
	}
	runSuite(t, "rethink", fmt.Sprintf("LEADERFEED_RETHINK_ADDR=%s", addr), "LEADERFEED_RETHINK_REQLITE=")
}
