//go:build linux

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

// raceEnabled is set when the tests run with -race; the node program is
// then built with -race too (but for plainNodeBinary).
var raceEnabled bool

// nodeBuild is one build of the node program.
type nodeBuild struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// node is the node program built as the tests run (with -race when they
// do); plainNode is it built without -race.
var node, plainNode nodeBuild

// nodeBinary builds the node program once per test binary.
func nodeBinary(t testing.TB) string { return node.build(t, raceEnabled) }

// plainNodeBinary builds the node program without -race, for tests that
// measure how long the library takes and whose node processes would
// otherwise spend most of it in the race detector (the deploy tests).
func plainNodeBinary(t testing.TB) string {
	if !raceEnabled {
		return nodeBinary(t)
	}
	return plainNode.build(t, false)
}

func (n *nodeBuild) build(t testing.TB, race bool) string {
	t.Helper()
	n.once.Do(func() {
		n.dir, n.err = os.MkdirTemp("", "leaderfeed-it-bin.")
		if n.err != nil {
			return
		}
		bin := filepath.Join(n.dir, "node")
		args := []string{"build", "-o", bin}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./node")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			n.err = fmt.Errorf("go build ./node: %v\n%s", err, out)
			return
		}
		n.bin = bin
	})
	if n.err != nil {
		t.Fatal(n.err)
	}
	return n.bin
}

func TestMain(m *testing.M) {
	if id := os.Getenv(fakeNodeEnv); id != "" {
		fakeNode(id)
		return
	}
	code := m.Run()
	for _, n := range []*nodeBuild{&node, &plainNode} {
		if n.dir != "" {
			os.RemoveAll(n.dir)
		}
	}
	if code == 0 {
		if err := goleak.Find(leakOptions...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions are set when a container was started: testcontainers-go and
// the Docker client keep goroutines of their own (reaper, HTTP keep-alive).
var leakOptions []goleak.Option
