//go:build linux

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

// fakeNodeEnv makes the test binary a fake node (see fakeNode) instead of
// running the tests.
const fakeNodeEnv = "LEADERFEED_IT_FAKE_NODE"

// fakeNode is a node process that wins term 1 at once and keeps leading
// until it is killed. Before that it starts a child (cat, reading file
// descriptor 3 until the test closes the other end) that shares its
// stdout: after the fake node is killed, its output stays open, as the
// output of a process the harness has not drained yet on a loaded machine.
func fakeNode(id string) {
	holder := exec.Command("cat")
	holder.Stdin = os.NewFile(3, "hold")
	holder.Stdout = os.Stdout
	if err := holder.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "fake node:", err)
		os.Exit(1)
	}
	for _, l := range []Line{{Kind: KindStart}, {Kind: KindSubStarted}, {Kind: KindElected, Term: 1}} {
		l.Mono, l.Node = Monotonic(), id
		fmt.Println(l.String())
	}
	time.Sleep(time.Hour)
}

// stubServer is a server nothing connects to.
type stubServer struct{}

func (stubServer) name() string                                     { return "stub" }
func (stubServer) targets() []string                                { return []string{"127.0.0.1:1"} }
func (stubServer) nodeURL([]string) string                          { return "" }
func (stubServer) prepare(context.Context, string) error            { return nil }
func (stubServer) restart(context.Context) error                    { return errUnsupported }
func (stubServer) killFeeds(context.Context, []string) (int, error) { return 0, errUnsupported }
func (stubServer) failover(context.Context) (int64, int64, error)   { return 0, 0, errUnsupported }

// A killed leader's term ends when it was killed, not when the harness
// notices that the process has ended (after draining its output and
// waiting for it), which on a loaded machine can be much later: a node
// elected in between is no overlap.
func TestKillEndsTermAtKill(t *testing.T) {
	cfg := defaultConfig(nil)
	cfg.nodes = 1
	h := newHarness(t, stubServer{}, cfg)
	hold, release, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { release.Close() }) // runs before the harness's killAll
	h.command = func(id string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fakeNodeEnv+"="+id)
		cmd.ExtraFiles = []*os.File{hold}
		return cmd
	}
	if err := h.start(0); err != nil {
		t.Fatal(err)
	}
	hold.Close()
	p := h.slots[0]
	if err := h.waitFor("the fake node to lead", 30*time.Second, func() bool { return p.term == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := h.kill(p); err != nil {
		t.Fatal(err)
	}

	// Another node elected just after the kill, while the harness has not
	// yet seen the killed process end (its output is still open).
	check := func() *Report {
		logs := h.logs()
		killed := logs[0].Killed
		if killed == 0 {
			t.Fatal("the kill was not recorded")
		}
		logs = append(logs, NodeLog{Proc: "n9#1", End: killed + int64(time.Hour),
			Lines: []Line{{Mono: killed + 1000, Kind: KindElected, Term: 2}}})
		r := Check(logs, nil, time.Second)
		if err := r.Err(); err != nil {
			t.Fatal(err)
		}
		if iv := r.Intervals[0]; iv.End != killed || iv.Reason != "killed" {
			t.Errorf("killed leader's interval %v, want it to end at the kill (%s)", iv, secs(killed))
		}
		return r
	}
	if h.logs()[0].End != 0 {
		t.Fatal("the process's end was noticed before its output closed; the test shows nothing")
	}
	check()

	// Once the process's end is noticed, its term still ended at the kill.
	release.Close()
	<-p.done
	if h.logs()[0].End == 0 {
		t.Fatal("end of the process not recorded")
	}
	check()
}
