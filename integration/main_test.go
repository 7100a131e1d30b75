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
// then built with -race too.
var raceEnabled bool

var node struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// nodeBinary builds the node program once per test binary.
func nodeBinary(t testing.TB) string {
	t.Helper()
	node.once.Do(func() {
		node.dir, node.err = os.MkdirTemp("", "leaderfeed-it-bin.")
		if node.err != nil {
			return
		}
		bin := filepath.Join(node.dir, "node")
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./node")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			node.err = fmt.Errorf("go build ./node: %v\n%s", err, out)
			return
		}
		node.bin = bin
	})
	if node.err != nil {
		t.Fatal(node.err)
	}
	return node.bin
}

func TestMain(m *testing.M) {
	if id := os.Getenv(fakeNodeEnv); id != "" {
		fakeNode(id)
		return
	}
	code := m.Run()
	if node.dir != "" {
		os.RemoveAll(node.dir)
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
