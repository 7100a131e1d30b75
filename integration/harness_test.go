//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Fault kinds, in the order of the summary table.
const (
	faultKill     = "kill"
	faultStop     = "stop"
	faultCut      = "cut"
	faultFeedKill = "feedkill"
	faultRestart  = "restart"
	// faultResign makes the leader Resign (SIGUSR1): the nodes participate,
	// so it hands the election over in one write.
	faultResign = "resign"
	// faultFailover kills a replicated database's primary (SIGKILL to
	// every process of it), promotes its standby and brings the old
	// primary back as the new standby.
	faultFailover = "failover"
)

// allKinds are the faults a single PostgreSQL server takes.
var allKinds = []string{faultKill, faultStop, faultCut, faultFeedKill, faultRestart, faultResign}

// server is the database the nodes run against.
type server interface {
	// name is the backend the nodes use (the node program's -backend).
	name() string
	// targets are the host:port addresses of the server's processes;
	// every node has a Proxy in front of each.
	targets() []string
	// nodeURL is what a node connects to, through its proxies (one per
	// target, in the same order).
	nodeURL(proxies []string) string
	prepare(ctx context.Context, election string) error
	// restart restarts the server and returns once it accepts connections
	// again, or errUnsupported.
	restart(ctx context.Context) error
	// killFeeds ends the changefeed connections of the given nodes only,
	// or fails with errUnsupported.
	killFeeds(ctx context.Context, ids []string) (int, error)
	// failover kills the primary of a replicated server, promotes a
	// standby and makes the old primary a standby again, or fails with
	// errUnsupported. It returns the Monotonic times of the kill and of
	// the moment the new primary took writes.
	failover(ctx context.Context) (killed, writable int64, err error)
}

// config of one run.
type config struct {
	nodes    int
	timing   heartbeat.Timing // with defaults applied
	kinds    []string
	perKind  int           // faults of each kind
	bound    time.Duration // a leader must exist this long after a fault
	election string
	seed     uint64
	// label names the run in the summary (default: the server's name).
	label string
	// reportOnly: violations of the rules are reported, not failures (a
	// store known to lose acknowledged writes).
	reportOnly bool
	// fence, if not 0, makes leading nodes run a fenced transaction about
	// this often, and the run count them and fail on a stale commit (see
	// FenceSchemaSQL); the server must be a fenceServer.
	fence time.Duration
}

func defaultConfig(kinds []string) config {
	// basetest.ScaleEnv stretches the timing, and so the bound, for a
	// slow machine or store.
	t := basetest.ScaledTiming(heartbeat.Timing{
		HeartbeatInterval:  50 * time.Millisecond,
		ElectionTimeoutMin: 250 * time.Millisecond,
		ElectionTimeoutMax: 500 * time.Millisecond,
	}.WithDefaults())
	return config{
		nodes:    5,
		timing:   t,
		kinds:    kinds,
		perKind:  faultsPerKindInCI,
		bound:    t.ElectionTimeoutMax + basetest.Scaled(2*time.Second),
		election: "integration",
		seed:     seed(),
	}
}

// seed returns LEADERFEED_SEED, to replay a run's order of faults and
// random choices (not its timing), or a random seed.
func seed() uint64 {
	if v, err := strconv.ParseUint(os.Getenv("LEADERFEED_SEED"), 10, 64); err == nil {
		return v
	}
	return rand.Uint64()
}

// soakFaults returns LEADERFEED_SOAK (total faults of a soak run), or 0.
func soakFaults(t testing.TB) int {
	v := os.Getenv("LEADERFEED_SOAK")
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("LEADERFEED_SOAK=%q: want a number of faults", v)
	}
	return n
}

// faultsPerKindInCI is how many faults of each kind a run that is no soak
// injects: 120 over the six kinds of TestFaultsPostgres, about a minute
// on an idle 2-core machine. Soaks (LEADERFEED_SOAK) run more.
const faultsPerKindInCI = 20

// proc is one node process.
type proc struct {
	name   string // unique: id#instance
	id     string
	slot   int
	cmd    *exec.Cmd
	stderr *tail
	done   chan struct{} // closed once the process has been waited for

	// Guarded by harness.mu.
	lines     []Line
	started   bool
	term      uint64 // the term it leads, 0 when it does not
	electedAt int64  // Mono of its last elected line
	feedUp    bool
	subErrors int
	end       int64
	killed    int64 // when kill sent it SIGKILL
	badLines  []string
}

// harness runs the nodes, their proxies and the faults of one test.
type harness struct {
	t      *testing.T
	cfg    config
	srv    server
	rng    *rand.Rand
	prox   [][]*Proxy // of each slot, one per target of the server
	nextID []int
	// command makes the command of a node process; nil: the node program.
	command func(id string) *exec.Cmd
	// idOf names the node a process of slot i runs as; nil: n<i+1>, the
	// same id for every process of the slot.
	idOf func(slot int) string

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change of state
	procs   []*proc       // every process ever started
	slots   []*proc       // the current process of each slot
	faults  []Fault
}

func newHarness(t *testing.T, srv server, cfg config) *harness {
	h := &harness{
		t: t, cfg: cfg, srv: srv,
		rng:     rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15)),
		changed: make(chan struct{}),
		slots:   make([]*proc, cfg.nodes),
		nextID:  make([]int, cfg.nodes),
	}
	t.Logf("%s: %d nodes, timing %+v, bound %v, seed %d", cmp.Or(cfg.label, srv.name()), cfg.nodes, cfg.timing, cfg.bound, cfg.seed)
	// Registered first, so it runs last: whatever happened, no process is
	// left behind.
	t.Cleanup(h.killAll)
	if h.cfg.label == "" {
		h.cfg.label = srv.name()
	}
	for range cfg.nodes {
		var slot []*Proxy
		for _, target := range srv.targets() {
			p, err := NewProxy(target)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			slot = append(slot, p)
		}
		h.prox = append(h.prox, slot)
	}
	return h
}

func (h *harness) notify() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// start starts the node process of slot i.
func (h *harness) start(i int) error {
	h.nextID[i]++
	id := fmt.Sprintf("n%d", i+1)
	if h.idOf != nil {
		id = h.idOf(i)
	}
	var cmd *exec.Cmd
	if h.command != nil {
		cmd = h.command(id)
	} else {
		tm := h.cfg.timing
		cmd = exec.Command(nodeBinary(h.t),
			"-backend", h.srv.name(),
			"-election", h.cfg.election,
			"-id", id,
			"-heartbeat", tm.HeartbeatInterval.String(),
			"-emin", tm.ElectionTimeoutMin.String(),
			"-emax", tm.ElectionTimeoutMax.String(),
			// Well under half the lease, so that a handover goes in
			// one write (base.Options.PresenceInterval).
			"-presence", (tm.LeaseDuration / 3).String(),
		)
		if h.cfg.fence > 0 {
			cmd.Args = append(cmd.Args, "-fence", h.cfg.fence.String())
		}
		addrs := make([]string, len(h.prox[i]))
		for k, p := range h.prox[i] {
			addrs[k] = p.Addr()
		}
		cmd.Env = append(os.Environ(), "LEADERFEED_NODE_URL="+h.srv.nodeURL(addrs))
	}
	// Should the test process die without its cleanup, its nodes die too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{name: fmt.Sprintf("%s#%d", id, h.nextID[i]), id: id, slot: i, cmd: cmd, stderr: &tail{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.slots[i] = p
	h.notify()
	h.mu.Unlock()
	go h.read(p, out)
	return nil
}

// read takes in the log of p until it ends, then waits for the process
// and notes when it had ended.
func (h *harness) read(p *proc, out io.Reader) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		l, ok, err := ParseLine(sc.Text())
		h.mu.Lock()
		switch {
		case err != nil:
			p.badLines = append(p.badLines, err.Error())
		case !ok:
		default:
			p.lines = append(p.lines, l)
			switch l.Kind {
			case KindStart:
				p.started = true
			case KindElected:
				p.term, p.electedAt = l.Term, l.Mono
			case KindUnelected:
				p.term = 0
			case KindSubStarted:
				p.feedUp = true
			case KindSubError:
				p.feedUp = false
				p.subErrors++
			}
		}
		h.notify()
		h.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, out)
	_ = p.cmd.Wait()
	end := Monotonic()
	h.mu.Lock()
	p.end = end
	p.term, p.feedUp = 0, false
	h.notify()
	h.mu.Unlock()
	close(p.done)
}

// kill sends p SIGKILL and notes when: the checker ends p's open term
// there, not when the harness gets round to noticing that p has ended.
func (h *harness) kill(p *proc) error {
	if p.cmd.Process == nil {
		return nil
	}
	err := p.cmd.Process.Signal(syscall.SIGKILL)
	// Taken once kill(2) has returned: from then on p cannot run user code
	// again (a thread running on another CPU is interrupted within
	// microseconds), so no earlier moment would be safe to end its term at.
	at := Monotonic()
	if err != nil {
		return err // already waited for: its end is recorded
	}
	h.mu.Lock()
	if p.killed == 0 {
		p.killed = at
	}
	h.mu.Unlock()
	return nil
}

// logs returns the logs of every process started so far.
func (h *harness) logs() []NodeLog {
	h.mu.Lock()
	defer h.mu.Unlock()
	logs := make([]NodeLog, 0, len(h.procs))
	for _, p := range h.procs {
		logs = append(logs, NodeLog{Proc: p.name, Lines: slices.Clone(p.lines), End: p.end, Killed: p.killed})
	}
	return logs
}

// waitFor waits until cond (called with h.mu held) is true.
func (h *harness) waitFor(what string, timeout time.Duration, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		h.mu.Lock()
		ok, ch := cond(), h.changed
		h.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("timed out after %v waiting for %s\n%s", timeout, what, h.state())
		}
	}
}

// state describes every current process, for failure messages.
func (h *harness) state() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, p := range h.slots {
		if p == nil {
			continue
		}
		fmt.Fprintf(&b, "  %s: started=%v term=%d feedUp=%v ended=%v", p.name, p.started, p.term, p.feedUp, p.end != 0)
		if n := len(p.lines); n > 0 {
			fmt.Fprintf(&b, " last: %s", p.lines[n-1])
		}
		if s := p.stderr.String(); s != "" {
			fmt.Fprintf(&b, "\n    stderr: %s", strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    "))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// leaderLocked returns the one current process that leads, if exactly one
// does.
func (h *harness) leaderLocked() *proc {
	var l *proc
	for _, p := range h.slots {
		if p.term != 0 {
			if l != nil {
				return nil
			}
			l = p
		}
	}
	return l
}

// stable waits until every node runs with its feed up and exactly one
// leads, and returns the leader.
func (h *harness) stable() (*proc, error) {
	var leader *proc
	err := h.waitFor("every node up with its feed and one leader", h.cfg.bound+10*time.Second, func() bool {
		for _, p := range h.slots {
			if !p.started || !p.feedUp || p.end != 0 {
				return false
			}
		}
		leader = h.leaderLocked()
		return leader != nil
	})
	return leader, err
}

func (h *harness) record(f Fault) {
	h.mu.Lock()
	f.Seq = len(h.faults) + 1
	h.faults = append(h.faults, f)
	h.mu.Unlock()
}

// injectAll injects perKind faults of each kind in a random order, each
// with inject once the nodes agree on a stable leader and after a random
// phase against the heartbeats, logging progress every faults; then it
// stops every node. It returns how long the faults took and the first
// failure, after which no more faults are injected.
func (h *harness) injectAll(ctx context.Context, every int, inject func(ctx context.Context, kind string, leader *proc) error) (time.Duration, error) {
	var plan []string
	for _, k := range h.cfg.kinds {
		for range h.cfg.perKind {
			plan = append(plan, k)
		}
	}
	h.rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })

	began := time.Now()
	var failed error
	for i, kind := range plan {
		leader, err := h.stable()
		if err == nil {
			// Vary the phase of the fault against the heartbeats.
			time.Sleep(time.Duration(h.rng.Int64N(int64(2 * h.cfg.timing.HeartbeatInterval))))
			err = inject(ctx, kind, leader)
		}
		if err != nil {
			failed = fmt.Errorf("fault %d of %d (%s): %w", i+1, len(plan), kind, err)
			break
		}
		if (i+1)%every == 0 {
			h.t.Logf("%d faults in %v", i+1, time.Since(began).Round(time.Second))
		}
	}
	elapsed := time.Since(began)
	h.stopAll()
	return elapsed, failed
}

// collect returns every node's log and the faults injected, reporting the
// log lines that did not parse as test errors.
func (h *harness) collect() ([]NodeLog, []Fault) {
	logs := h.logs()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range h.procs {
		for _, b := range p.badLines {
			h.t.Errorf("%s: %s", p.name, b)
		}
	}
	return logs, h.faults
}

// run starts the nodes, injects the faults and checks the logs.
func (h *harness) run(ctx context.Context) {
	t := h.t
	if err := h.srv.prepare(ctx, h.cfg.election); err != nil {
		t.Fatalf("prepare %s: %v", h.srv.name(), err)
	}
	if h.cfg.fence > 0 {
		if err := h.prepareFence(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range h.cfg.nodes {
		if err := h.start(i); err != nil {
			t.Fatal(err)
		}
	}
	load := startLoadSampler()
	elapsed, failed := h.injectAll(ctx, 100, h.inject)
	load.close()
	if failed != nil {
		t.Error(failed)
	}
	logs, faults := h.collect()
	// The liveness bound follows the load met during each fault; the
	// safety rules do not depend on it.
	load.stretch(faults, h.cfg.bound)
	rep := Check(logs, faults, h.cfg.bound)
	for _, s := range rep.Starved {
		t.Logf("the machine was starved: %s", s)
	}
	table := rep.Summary(faults, h.cfg.kinds)
	summary := fmt.Sprintf("%s: %d faults in %v, %d leadership intervals, seed %d\n\n%s\n%s",
		h.cfg.label, len(faults), elapsed.Round(time.Second), len(rep.Intervals), h.cfg.seed, table, rep.Counts())
	if db := dbFailoverTimes(faults); db != "" {
		summary += "\n" + db
	}
	var fenceErr error
	if h.cfg.fence > 0 {
		var fsum string
		fsum, fenceErr = h.checkFence(ctx, logs, faults)
		summary += "\nfenced writes (postgres.Fence, every " + h.cfg.fence.String() + " or so while leading):\n\n" + fsum
	}
	if soakFaults(t) > 0 || h.cfg.reportOnly {
		fmt.Println(summary)
	} else {
		t.Log("\n" + summary)
	}
	if err := errors.Join(rep.Err(), fenceErr); err != nil {
		h.keepLogs(logs, faults)
		if h.cfg.reportOnly {
			t.Logf("reported, not failed (%s):\n%v", h.cfg.label, err)
		} else {
			t.Error(err)
		}
	}
}

// dbFailoverTimes describes how long the database itself took to fail
// over (from the kill of the primary to a primary taking writes again),
// when there were failovers.
func dbFailoverTimes(faults []Fault) string {
	var ds []time.Duration
	for _, f := range faults {
		if f.Kind == faultFailover {
			ds = append(ds, time.Duration(f.Ref-f.At))
		}
	}
	if len(ds) == 0 {
		return ""
	}
	return fmt.Sprintf("database failover (kill of the primary to a primary taking writes): median %s, p99 %s, worst %s",
		pct(ds, 0.5), pct(ds, 0.99), pct(ds, 1))
}

// keepLogs writes every node's log and the faults into a directory that
// outlives the test, for a failure to be studied.
func (h *harness) keepLogs(logs []NodeLog, faults []Fault) {
	dir, err := os.MkdirTemp("", "leaderfeed-it-logs.")
	if err != nil {
		h.t.Log(err)
		return
	}
	var b strings.Builder
	for _, f := range faults {
		fmt.Fprintf(&b, "%d %s victim=%s at=%d ref=%d lease_end_by=%d\n", f.Seq, f.Kind, f.Victim, f.At, f.Ref, f.LeaseEndBy)
	}
	_ = os.WriteFile(filepath.Join(dir, "faults.txt"), []byte(b.String()), 0o644)
	for _, lg := range logs {
		b.Reset()
		for _, l := range lg.Lines {
			b.WriteString(l.String() + "\n")
		}
		fmt.Fprintf(&b, "end %d killed %d\n", lg.End, lg.Killed)
		_ = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(lg.Proc, "#", "_")+".log"), []byte(b.String()), 0o644)
	}
	h.t.Logf("node logs and faults kept in %s", dir)
}

// inject injects one fault aimed at the leader and waits until the nodes
// have recovered from it (or gives up after the bound and then some).
func (h *harness) inject(ctx context.Context, kind string, leader *proc) error {
	tm, bound := h.cfg.timing, h.cfg.bound
	h.mu.Lock()
	term := leader.term
	h.mu.Unlock()
	newLeader := func() bool { // some other process leads a later term
		l := h.leaderLocked()
		return l != nil && l != leader && l.term > term
	}
	switch kind {
	case faultKill:
		h.record(Fault{Kind: kind, Victim: leader.name, At: Monotonic(), NewLeader: true})
		if err := h.kill(leader); err != nil {
			return err
		}
		select {
		case <-leader.done:
		case <-time.After(10 * time.Second):
			return errors.New("killed leader did not end")
		}
		if err := h.start(leader.slot); err != nil {
			return err
		}
		return h.waitFor("a new leader after the kill", bound+5*time.Second, newLeader)

	case faultStop:
		// Longer than the lease; sometimes shorter, sometimes longer than
		// the election timeout, so the node wakes both before and after
		// another one has taken over.
		lo, hi := tm.LeaseDuration+20*time.Millisecond, tm.ElectionTimeoutMax+200*time.Millisecond
		d := lo + time.Duration(h.rng.Int64N(int64(hi-lo)))
		at := Monotonic()
		if err := leader.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		// Once every thread is seen stopped no renewal can be sent, so
		// the lease ends by then plus LeaseDuration, whatever the node
		// reports.
		if err := waitStopped(leader.cmd.Process.Pid, time.Second); err != nil {
			return err
		}
		h.record(Fault{Kind: kind, Victim: leader.name, At: at, NewLeader: true,
			LeaseEndBy: Monotonic() + int64(tm.LeaseDuration)})
		time.Sleep(d)
		if err := leader.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			return err
		}
		return h.waitFor(fmt.Sprintf("the stopped leader (%v) to step down and a leader", d), bound+5*time.Second, func() bool {
			l := h.leaderLocked()
			return l != nil && l.term > term
		})

	case faultCut:
		h.record(Fault{Kind: kind, Victim: leader.name, At: Monotonic(), NewLeader: true})
		for _, px := range h.prox[leader.slot] {
			px.Cut()
		}
		err := h.waitFor("a new leader while the old one is cut off", bound+5*time.Second, func() bool {
			return newLeader() && leader.term == 0
		})
		time.Sleep(time.Duration(h.rng.Int64N(int64(2 * tm.HeartbeatInterval))))
		for _, px := range h.prox[leader.slot] {
			px.Heal()
		}
		return err

	case faultFailover:
		killed, writable, err := h.srv.failover(ctx)
		if err != nil {
			return err
		}
		// The time to leader counts from the kill; the bound from the
		// moment the store took writes again.
		h.record(Fault{Kind: kind, Victim: h.srv.name() + " primary", At: killed, Ref: writable, Since: killed})
		return h.waitFor("a leader after the failover", bound+5*time.Second, func() bool {
			l := h.leaderLocked()
			return l != nil && (l.electedAt > killed || l == leader && l.term == term)
		})

	case faultFeedKill:
		victims := []*proc{leader}
		for {
			p := h.slots[h.rng.IntN(len(h.slots))]
			if p != leader {
				victims = append(victims, p)
				break
			}
		}
		ids := make([]string, len(victims))
		before := make([]int, len(victims))
		h.mu.Lock()
		for i, p := range victims {
			ids[i], before[i] = p.id, p.subErrors
		}
		h.mu.Unlock()
		at := Monotonic()
		h.record(Fault{Kind: kind, Victim: strings.Join(ids, ","), At: at, Ref: at})
		n, err := h.srv.killFeeds(ctx, ids)
		if err != nil {
			return err
		}
		if n != len(ids) {
			return fmt.Errorf("terminated %d listener connections of %v, want %d", n, ids, len(ids))
		}
		return h.waitFor("the feeds to fail and reopen", bound+5*time.Second, func() bool {
			for i, p := range victims {
				if p.subErrors == before[i] || !p.feedUp {
					return false
				}
			}
			return h.leaderLocked() != nil
		})

	case faultResign:
		h.record(Fault{Kind: kind, Victim: leader.name, At: Monotonic(), NewLeader: true})
		if err := leader.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			return err
		}
		// Any process of a later term: under load the leader may have
		// lost its lease before the signal (its Unelected line still on
		// the way), so Resign found it not leading, and it may win the
		// next term itself.
		return h.waitFor("a leader of a later term after the resign", bound+5*time.Second, func() bool {
			l := h.leaderLocked()
			return l != nil && l.term > term
		})

	case faultRestart:
		before := make(map[*proc]int)
		h.mu.Lock()
		for _, p := range h.slots {
			before[p] = p.subErrors
		}
		h.mu.Unlock()
		at := Monotonic()
		if err := h.srv.restart(ctx); err != nil {
			return err
		}
		h.record(Fault{Kind: kind, Victim: h.srv.name(), At: at, Ref: Monotonic()})
		return h.waitFor("every feed to notice the restart and reopen, and a leader", bound+5*time.Second, func() bool {
			for _, p := range h.slots {
				if p.subErrors == before[p] || !p.feedUp {
					return false
				}
			}
			return h.leaderLocked() != nil
		})
	}
	return fmt.Errorf("unknown fault %q", kind)
}

// stopAll ends every node process gracefully (SIGCONT, then SIGTERM: the
// leader resigns and each prints its last lines), killing the ones that do
// not end within a few seconds.
func (h *harness) stopAll() {
	h.mu.Lock()
	procs := append([]*proc(nil), h.procs...)
	h.mu.Unlock()
	for _, p := range procs {
		if p.cmd.Process != nil {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	timeout := time.After(10 * time.Second)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-timeout:
			h.t.Errorf("%s did not stop within 10s of SIGTERM; killed", p.name)
			h.killAll()
			return
		}
	}
}

// killAll kills every process still running and waits for it.
func (h *harness) killAll() {
	h.mu.Lock()
	procs := append([]*proc(nil), h.procs...)
	h.mu.Unlock()
	for _, p := range procs {
		_ = h.kill(p)
	}
	for _, p := range procs {
		<-p.done
	}
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc/<pid>/task/*/stat).
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(tasks) == 0 {
			return fmt.Errorf("threads of process %d: %v", pid, err)
		}
		all := true
		for _, task := range tasks {
			b, err := os.ReadFile(task)
			if err != nil {
				all = false
				break
			}
			// The state follows the command name, which is in parentheses.
			i := bytes.LastIndexByte(b, ')')
			if i < 0 || i+2 >= len(b) || (b[i+2] != 'T' && b[i+2] != 't') {
				all = false
				break
			}
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped %v after SIGSTOP", pid, timeout)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// tail keeps the last few kilobytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > 4096 {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-4096:]...)
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
