package main

// End-to-end tests: they build leaderfeed and a test child with go build
// and run them as processes. Those that need PostgreSQL use
// LEADERFEED_POSTGRES_URL (scripts/test.sh starts a server); without it
// they skip with a one-line reason, and fail when CI=true.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	neturl "net/url"
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

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Timing of the end-to-end runs: renewals every 50 ms, a lease of 200 ms,
// election timeouts of 300..400 ms, each times basetest.ScaleEnv's factor
// (the bounds the runs check follow).
var (
	timing = basetest.ScaledTiming(heartbeat.Timing{HeartbeatInterval: 50 * time.Millisecond,
		LeaseDuration: 200 * time.Millisecond, ElectionTimeoutMin: 300 * time.Millisecond, ElectionTimeoutMax: 400 * time.Millisecond})
	timingFlags = []string{"--heartbeat", timing.HeartbeatInterval.String(), "--lease", timing.LeaseDuration.String(),
		"--election-timeout-min", timing.ElectionTimeoutMin.String(), "--election-timeout-max", timing.ElectionTimeoutMax.String()}
	electionTimeoutMax = timing.ElectionTimeoutMax
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds leaderfeed and testchild with go build once per test
// binary, into a temporary directory that TestMain removes.
func binaries(t *testing.T) (leaderfeed, child string) {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "leaderfeed-e2e-")
		if buildErr != nil {
			return
		}
		for _, b := range [][2]string{{"leaderfeed", "."}, {"testchild", "./internal/testchild"}} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, b[0]), b[1]).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", b[1], err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "leaderfeed"), filepath.Join(binDir, "testchild")
}

func postgresURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("LEADERFEED_POSTGRES_URL")
	if u == "" {
		testenv.Unavailable(t, "LEADERFEED_POSTGRES_URL is not set (scripts/test.sh starts a server)")
	}
	return u
}

// uniqueName returns an election or schema name no other test run uses.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s_%d_%d", prefix, os.Getpid(), time.Now().UnixNano())
}

// freeAddr returns a loopback address with a port free now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// proc is a leaderfeed process of a test.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	health string
	metric string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start starts bin with args; the test's cleanup kills it if still running.
func start(t *testing.T, bin string, stdout io.Writer, args ...string) *proc {
	t.Helper()
	return startEnv(t, bin, nil, stdout, args...)
}

// startEnv is start with the environment env (nil: this process's).
func startEnv(t *testing.T, bin string, env []string, stdout io.Writer, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr, p.cmd.Env = stdout, p.stderr, env
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("stderr of %v:\n%s", args, p.stderr.String())
		}
	})
	return p
}

// wait waits for p to exit and returns its exit code.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("process %v still running after %v", p.cmd.Args, d)
	}
	return -1
}

// childRecord is what a test child wrote.
type childRecord struct {
	term       uint64
	node       string
	pid        int
	start, end time.Time // end zero: no end line (killed)
	locked     bool
	grandchild int // the pid of the process the child started
}

// readChildren reads every child log of dir, by start time.
func readChildren(t *testing.T, dir string) []childRecord {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var out []childRecord
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var c childRecord
		for line := range strings.Lines(string(data)) {
			fs := strings.Fields(line)
			if len(fs) < 5 {
				continue
			}
			term, _ := strconv.ParseUint(fs[1], 10, 64)
			pid, _ := strconv.Atoi(fs[3])
			ns, _ := strconv.ParseInt(fs[4], 10, 64)
			switch fs[0] {
			case "start":
				c.term, c.node, c.pid, c.start = term, fs[2], pid, time.Unix(0, ns)
				c.locked = len(fs) > 5 && fs[5] == "lock=true"
			case "end":
				c.end = time.Unix(0, ns)
			case "grandchild":
				c.grandchild = pid
			}
		}
		if c.pid != 0 {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b childRecord) int { return a.start.Compare(b.start) })
	return out
}

// waitChildren waits until dir holds n children's start lines.
func waitChildren(t *testing.T, dir string, n int, d time.Duration) []childRecord {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		cs := readChildren(t, dir)
		if len(cs) >= n {
			return cs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d children started after %v, want %d: %+v", len(cs), d, n, cs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie counts as dead).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(data), ") ")
	return !strings.HasPrefix(rest, "Z")
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// statusOf runs leaderfeed status --json.
func statusOf(t *testing.T, bin, url, election string, extra ...string) statusJSON {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"status", "--store", url, "--election", election, "--json"}, extra...)...).Output()
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	var s statusJSON
	if err := json.Unmarshal(out, &s); err != nil {
		t.Fatalf("status printed %q: %v", out, err)
	}
	return s
}

// TestRunThreeNodes: three leaderfeed run processes on the real server.
// One child at a time (checked by the children's advisory lock and by
// their start and end times), a SIGTERM of the leader hands over in
// milliseconds, a kill -9 of the leader kills its child and another child
// starts within the election timeout; status, watch, the health handler
// and the metrics are checked on the way.
func TestRunThreeNodes(t *testing.T) {
	url := postgresURL(t)
	bin, child := binaries(t)
	for attempt := 1; !runThreeNodes(t, url, bin, child); attempt++ {
		if attempt == 3 {
			t.Fatalf("the first leader's lease ran out while it settled in %d attempts: the machine is too slow for this timing (%s scales it)", attempt, basetest.ScaleEnv)
		}
		t.Logf("attempt %d: the first leader's lease ran out while it settled (allowed on a loaded machine); again on a fresh election", attempt)
	}
}

// runThreeNodes is one attempt of TestRunThreeNodes. It returns false,
// having stopped its processes, when leadership moved while the first
// leader settled and every term that ended did so by lease expiry, with
// no two children at once: the guarantee allows that, the rest of the
// test needs one stable leader.
func runThreeNodes(t *testing.T, url, bin, child string) bool {
	t.Helper()
	dir := t.TempDir()
	election := uniqueName("e2e")
	lockKey := strconv.FormatInt(time.Now().UnixNano()&0x7fffffffffff, 10)

	// watch never creates the table: let run make it first (on an
	// election of its own; CMD exits at once). status and watch take no
	// timing flags.
	mk := start(t, bin, io.Discard, append([]string{"run", "--store", url, "--election", uniqueName("mk")}, append(timingFlags, "--", "true")...)...)
	if code := mk.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("run making the table: exit %d", code)
	}
	var watchOut syncBuffer
	watch := start(t, bin, &watchOut, "watch", "--store", url, "--election", election)

	nodes := map[string]*proc{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("node%d", i)
		p := &proc{health: freeAddr(t), metric: freeAddr(t)}
		args := append([]string{"run", "--store", url, "--election", election, "--id", id, "--value", "addr-" + id,
			"--grace", "5s", "--health", p.health, "--metrics", p.metric, "--log-level", "debug"}, timingFlags...)
		args = append(args, "--", child, dir, url, lockKey)
		q := start(t, bin, io.Discard, args...)
		q.health, q.metric = p.health, p.metric
		nodes[id] = q
	}

	first := waitChildren(t, dir, 1, 10*time.Second)[0]
	leader := nodes[first.node]
	if leader == nil {
		t.Fatalf("child of unknown node %q", first.node)
	}
	time.Sleep(3 * electionTimeoutMax) // let every node settle
	if cs := readChildren(t, dir); len(cs) != 1 {
		for i, c := range cs {
			n := nodes[c.node]
			switch {
			case !c.locked:
				t.Fatalf("child %d (term %d) found the lock taken: two children at once", i, c.term)
			case i > 0 && (c.term <= cs[i-1].term || cs[i-1].end.IsZero() || !cs[i-1].end.Before(c.start)):
				t.Fatalf("children %+v: terms must increase, each child ending before the next starts", cs)
			case i < len(cs)-1 && (n == nil || !strings.Contains(n.stderr.String(), fmt.Sprintf("term=%d reason=lease-expired", c.term))):
				t.Fatalf("children of a stable leader: %+v, want 1; term %d ended, not by lease expiry", cs, c.term)
			}
		}
		for _, p := range append(slices.Collect(maps.Values(nodes)), watch) {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		return false
	}
	// The log names CMD's own pid (the child's), not its guard's.
	if want := fmt.Sprintf(`msg="leaderfeed: CMD started" term=%d pid=%d group=`, first.term, first.pid); !strings.Contains(leader.stderr.String(), want) {
		t.Fatalf("the leader's log does not say %q:\n%s", want, leader.stderr.String())
	}

	// status, health and metrics of the leader, on the real server.
	st := statusOf(t, bin, url, election)
	if !st.Exists || st.Leader != first.node || st.Term != first.term || st.Value != "addr-"+first.node || st.AgeSeconds < 0 || st.AgeSeconds > 1 {
		t.Fatalf("status %+v, want leader %s, term %d, value addr-%s, a heartbeat under 1 s old", st, first.node, first.term, first.node)
	}
	for id, p := range nodes {
		if code, body := httpGet(t, "http://"+p.health+"/healthz"); code != http.StatusOK || body != "ok\n" {
			t.Fatalf("/healthz of %s: %d %q", id, code, body)
		}
	}
	_, metrics := httpGet(t, "http://"+leader.metric+"/metrics")
	for _, want := range []string{
		`leaderfeed_leading{leaderfeed_election="` + election + `",leaderfeed_node="` + first.node + `"`,
		`leaderfeed_term{leaderfeed_election="` + election + `",leaderfeed_node="` + first.node + `"`,
		`leaderfeed_renewal_duration_seconds_bucket{leaderfeed_election="` + election + `",leaderfeed_node="` + first.node + `",leaderfeed_outcome="success"`,
		`leaderfeed_claim_duration_seconds_count{leaderfeed_election="` + election + `",leaderfeed_node="` + first.node + `",leaderfeed_outcome="success"`,
		"leaderfeed_heartbeat_age_seconds{",
	} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("the leader's /metrics has no %q:\n%s", want, metrics)
		}
	}
	termLine := false
	for line := range strings.Lines(metrics) {
		if strings.HasPrefix(line, "leaderfeed_term{") && strings.HasSuffix(line, fmt.Sprintf("} %d\n", first.term)) {
			termLine = true
		}
	}
	if !termLine {
		t.Fatalf("the leader's /metrics does not give term %d:\n%s", first.term, metrics)
	}
	t.Logf("metrics of the leader (excerpt):\n%s", excerpt(metrics, "leaderfeed_"))

	// SIGTERM of the leader: its child ends, another starts in milliseconds.
	// The line that says so names CMD's own pid too, and its group's.
	stopping := fmt.Sprintf(`msg="leaderfeed: stopping CMD" term=%d pid=%d group=`, first.term, first.pid)
	sent := time.Now()
	if err := leader.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	cs := waitChildren(t, dir, 2, 5*time.Second)
	second := cs[1]
	handover := second.start.Sub(sent)
	if code := leader.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("leader exited %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(leader.stderr.String(), stopping) {
		t.Fatalf("the leader's log does not say %q:\n%s", stopping, leader.stderr.String())
	}
	old := readChildren(t, dir)[0]
	if old.end.IsZero() || !old.end.Before(second.start) {
		t.Fatalf("first child ended at %v, second started at %v: want the end first", old.end, second.start)
	}
	if handover >= timing.ElectionTimeoutMin {
		t.Fatalf("handover after SIGTERM took %v, want less than the election timeout (it must not wait for one)", handover)
	}
	t.Logf("SIGTERM handover: %v from the signal to the next child's start (old child ended %v after the signal)", handover, old.end.Sub(sent))
	delete(nodes, first.node)

	// kill -9 of the new leader: its child dies with it, another starts
	// within the election timeout of the last heartbeat.
	time.Sleep(electionTimeoutMax)
	leader = nodes[second.node]
	killed := time.Now()
	if err := leader.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for alive(second.pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %d of the killed leaderfeed still runs", second.pid)
		}
		time.Sleep(time.Millisecond)
	}
	childDead := time.Since(killed)
	// What the child started dies too (on Linux, where CMD runs under a
	// guard that kills its whole process group when leaderfeed dies).
	if gc := readChildren(t, dir)[1].grandchild; guarded {
		if gc == 0 {
			t.Fatal("the child logged no grandchild")
		}
		for alive(gc) {
			if time.Now().After(deadline) {
				t.Fatalf("grandchild %d of the killed leaderfeed's child still runs", gc)
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("grandchild of the killed node dead after %v", time.Since(killed))
	}
	cs = waitChildren(t, dir, 3, 5*time.Second)
	third := cs[2]
	failover := third.start.Sub(killed)
	if failover > electionTimeoutMax+basetest.Scaled(300*time.Millisecond) {
		t.Fatalf("failover after kill -9 took %v, want about the election timeout (%v)", failover, electionTimeoutMax)
	}
	t.Logf("kill -9 failover: child of the killed node dead after %v, next child started %v after the kill", childDead, failover)
	delete(nodes, second.node)

	// The last leader: SIGTERM with nobody to hand over to.
	last := nodes[third.node]
	time.Sleep(electionTimeoutMax)
	_ = last.cmd.Process.Signal(syscall.SIGTERM)
	if code := last.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("last leader exited %d, want 0", code)
	}
	for id, p := range nodes {
		if id != third.node {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			p.wait(t, 5*time.Second)
		}
	}

	// Never two children at once: the advisory lock (independent of
	// leaderfeed) and the intervals; terms strictly increase.
	cs = readChildren(t, dir)
	if len(cs) != 3 {
		t.Fatalf("children %+v, want 3", cs)
	}
	for i, c := range cs {
		if !c.locked {
			t.Fatalf("child %d (term %d) found the lock taken: two children at once", i, c.term)
		}
		if c.end.IsZero() && c.pid != second.pid {
			t.Fatalf("child %+v has no end line but was not killed", c)
		}
		if i > 0 {
			prev := cs[i-1]
			if c.term <= prev.term {
				t.Fatalf("terms %d then %d: want increasing", prev.term, c.term)
			}
			if !prev.end.IsZero() && !prev.end.Before(c.start) {
				t.Fatalf("child of term %d ended %v after the next started", prev.term, prev.end.Sub(c.start))
			}
		}
		if alive(c.pid) {
			t.Fatalf("child %d still runs", c.pid)
		}
	}

	// watch saw each leader in turn.
	_ = watch.cmd.Process.Signal(syscall.SIGTERM)
	if code := watch.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("watch exited %d after SIGTERM, want 0", code)
	}
	var seen []string
	sc := bufio.NewScanner(strings.NewReader(watchOut.String()))
	for sc.Scan() {
		var l watchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("watch printed %q: %v", sc.Text(), err)
		}
		if l.Leader != "" {
			seen = append(seen, fmt.Sprintf("%s/%d", l.Leader, l.Term))
		}
	}
	want := []string{fmt.Sprintf("%s/%d", first.node, first.term), fmt.Sprintf("%s/%d", second.node, second.term), fmt.Sprintf("%s/%d", third.node, third.term)}
	if !slices.Equal(seen, want) {
		t.Fatalf("watch saw leaders %v, want %v\n%s", seen, want, watchOut.String())
	}
	return true
}

// excerpt returns the lines of s that start with prefix.
func excerpt(s, prefix string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if strings.HasPrefix(line, prefix) && !strings.Contains(line, "_bucket{") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// CMD exiting by itself: without --restart leaderfeed resigns and exits
// with its status; with --restart it campaigns again and runs CMD for a
// new term.
func TestRunChildExits(t *testing.T) {
	url := postgresURL(t)
	bin, _ := binaries(t)
	election := uniqueName("exit")
	p := start(t, bin, io.Discard, append([]string{"run", "--store", url, "--election", election}, append(timingFlags, "--", "sh", "-c", "exit 7")...)...)
	if code := p.wait(t, 10*time.Second); code != 7 {
		t.Fatalf("exit code %d, want CMD's 7", code)
	}
	if st := statusOf(t, bin, url, election); st.Leader != "" || st.Term != 1 {
		t.Fatalf("after CMD exited: %+v, want the term-1 record vacant (resigned)", st)
	}

	dir := t.TempDir()
	terms := filepath.Join(dir, "terms")
	election = uniqueName("restart")
	p = start(t, bin, io.Discard, append([]string{"run", "--store", url, "--election", election, "--restart"},
		append(timingFlags, "--", "sh", "-c", `echo "$LEADERFEED_TERM" >> "$0"`, terms)...)...)
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(terms)
		if got := strings.Fields(string(data)); len(got) >= 3 {
			// Each run is a new term. Not 1 2 3 exactly: a lease that runs
			// out on a loaded machine before CMD writes uses a term up.
			for i := 1; i < 3; i++ {
				a, _ := strconv.Atoi(got[i-1])
				b, _ := strconv.Atoi(got[i])
				if a < 1 || b <= a {
					t.Fatalf("terms %v, want three rising terms, one a run", got)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CMD ran for terms %q within 10 s, want three runs", data)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
}

// A CMD that ignores SIGTERM gets SIGKILL after --grace.
func TestRunGrace(t *testing.T) {
	url := postgresURL(t)
	bin, _ := binaries(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	p := start(t, bin, io.Discard, append([]string{"run", "--store", url, "--election", uniqueName("grace"), "--grace", "200ms"},
		append(timingFlags, "--", "sh", "-c", `trap "" TERM; echo $$ > "$0"; while :; do sleep 0.01; done`, pidFile)...)...)
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(5 * time.Millisecond) {
		data, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		if time.Now().After(deadline) {
			t.Fatal("CMD did not start")
		}
	}
	sent := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	took := time.Since(sent)
	if alive(pid) {
		t.Fatalf("CMD %d that ignores SIGTERM still runs", pid)
	}
	if took < 200*time.Millisecond {
		t.Fatalf("leaderfeed exited %v after SIGTERM, before the grace period", took)
	}
}

// applySchema applies the output of leaderfeed schema (the default
// table, or the one of args) to the database of url.
func applySchema(t *testing.T, bin, url string, args ...string) {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"schema", "--store", url}, args...)...).Output()
	if err != nil {
		t.Fatalf("schema: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, string(out)); err != nil {
		t.Fatalf("the script of schema fails: %v\n%s", err, out)
	}
}

// adminExec runs sql on the database of url.
func adminExec(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// withURL returns url with what change does to it.
func withURL(t *testing.T, url string, change func(*neturl.URL)) string {
	t.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	change(u)
	return u.String()
}

// runErrorLine runs leaderfeed with args, wants exit code want within
// 20 s, and returns the last line of its standard error: the error.
func runErrorLine(t *testing.T, bin string, want int, args ...string) string {
	t.Helper()
	p := start(t, bin, io.Discard, args...)
	started := time.Now()
	if code := p.wait(t, 20*time.Second); code != want {
		t.Fatalf("%v: exit code %d, want %d\n%s", args, code, want, p.stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	last := lines[len(lines)-1]
	t.Logf("%s after %v, exit %d: %s", args[0], time.Since(started).Round(time.Millisecond), want, last)
	return last
}

// libraryWords are the library's names that the command must not show:
// it speaks of its flags and of leaderfeed schema.
var libraryWords = []string{"Options.", "NoCreate", "SchemaSQL", "Create make", "MaxNameLen", "MaxValueLen", "LeaseDuration", "ElectionTimeoutMin", "Value is"}

func checkCLIWords(t *testing.T, line string) {
	t.Helper()
	for _, w := range libraryWords {
		if strings.Contains(line, w) {
			t.Errorf("%q speaks the library's words (%q), not the command's", line, w)
		}
	}
}

// As a role with no privilege on an existing election table, and again
// with SELECT only, run --no-create exits with the refusal's code (4)
// within 20 s, on one line naming the permission and the GRANT; it does
// not run on, retrying what cannot succeed.
func TestRunRefused(t *testing.T) {
	url := postgresURL(t)
	bin, _ := binaries(t)
	table := uniqueName("refused")
	applySchema(t, bin, url, "--table", table)
	t.Cleanup(func() { adminExec(t, url, `DROP TABLE IF EXISTS "`+table+`"`) })
	for _, tc := range []struct {
		name, grant, says string
	}{
		{"no privilege", "", "exists, but this role has no SELECT privilege on it"},
		{"SELECT only", `GRANT SELECT ON "` + table + `" TO %s`, "permission denied for table " + table},
	} {
		t.Run(tc.name, func(t *testing.T) {
			role := uniqueName("role")
			adminExec(t, url, `CREATE ROLE "`+role+`" LOGIN PASSWORD 'pw'`)
			t.Cleanup(func() { adminExec(t, url, `DROP OWNED BY "`+role+`"; DROP ROLE "`+role+`"`) })
			if tc.grant != "" {
				adminExec(t, url, strings.ReplaceAll(tc.grant, "%s", `"`+role+`"`))
			}
			line := runErrorLine(t, bin, exitRefused, append([]string{"run", "--store", withURL(t, url, func(u *neturl.URL) { u.User = neturl.UserPassword(role, "pw") }), "--election", "e",
				"--table", table, "--no-create"}, append(timingFlags, "--", "sh", "-c", "exit 0")...)...)
			for _, w := range []string{"leaderfeed run: ", tc.says, `GRANT SELECT, INSERT, UPDATE, DELETE ON "public"."` + table + `" TO "` + role + `"`} {
				if !strings.Contains(line, w) {
					t.Errorf("last line %q does not say %q", line, w)
				}
			}
			checkCLIWords(t, line)
		})
	}
}

// A GRANT revoked while run leads: the refused renewal ends run with
// exit 4 and the fix, CMD is stopped, and the log line of the end of its
// term names the refusal rather than saying only that it was stopped.
func TestRunRefusedWhileRunning(t *testing.T) {
	url := postgresURL(t)
	bin, _ := binaries(t)
	table := uniqueName("revoked")
	applySchema(t, bin, url, "--table", table)
	t.Cleanup(func() { adminExec(t, url, `DROP TABLE IF EXISTS "`+table+`" CASCADE`) })
	role := uniqueName("role")
	adminExec(t, url, `CREATE ROLE "`+role+`" LOGIN PASSWORD 'pw'; GRANT SELECT, INSERT, UPDATE, DELETE ON "`+table+`" TO "`+role+`"`)
	t.Cleanup(func() { adminExec(t, url, `DROP OWNED BY "`+role+`"; DROP ROLE "`+role+`"`) })
	env := append(envWithout(storeEnv), storeEnv+"="+withURL(t, url, func(u *neturl.URL) { u.User = neturl.User(role) }), "PGPASSWORD=pw")
	dir := t.TempDir()
	p := startEnv(t, bin, env, io.Discard, append([]string{"run", "--election", "e", "--table", table, "--no-create"},
		append(timingFlags, "--", "sh", "-c", `echo $$ > "$0"; exec sleep 600`, filepath.Join(dir, "pid"))...)...)
	waitFor(t, 20*time.Second, "CMD started", func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "pid"))
		return len(data) > 0
	})
	adminExec(t, url, `REVOKE UPDATE ON "`+table+`" FROM "`+role+`"`)
	if code := p.wait(t, 20*time.Second); code != exitRefused {
		t.Fatalf("exit %d after the REVOKE, want %d\n%s", code, exitRefused, p.stderr.String())
	}
	log := p.stderr.String()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "permission denied for table "+table) || !strings.Contains(last, "fix: GRANT") {
		t.Fatalf("last line %q, want the refusal and the fix", last)
	}
	unelected := grepLines(log, `msg="leaderfeed: unelected"`)
	if !strings.Contains(unelected, "reason=stopped") || !strings.Contains(unelected, "permission denied for table "+table) {
		t.Fatalf("the end of the term %q does not name the refusal\n%s", unelected, log)
	}
	t.Logf("%s", unelected)
}

// watch and status change nothing: against a database without the
// election table they fail (exit 4, saying how to make it) and leave it
// without the table.
func TestReadOnlyCommandsCreateNothing(t *testing.T) {
	url := postgresURL(t)
	bin, _ := binaries(t)
	db := uniqueName("empty")
	adminExec(t, url, `CREATE DATABASE "`+db+`"`)
	t.Cleanup(func() { adminExec(t, url, `DROP DATABASE "`+db+`" WITH (FORCE)`) })
	empty := withURL(t, url, func(u *neturl.URL) { u.Path = "/" + db })
	for _, command := range []string{"watch", "status"} {
		line := runErrorLine(t, bin, exitRefused, command, "--store", empty, "--election", "e")
		for _, w := range []string{"leaderfeed " + command + ": ", "does not exist", "leaderfeed schema", "leaderfeed run"} {
			if !strings.Contains(line, w) {
				t.Errorf("%s: last line %q does not say %q", command, line, w)
			}
		}
		checkCLIWords(t, line)
	}
	var n int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, empty)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'leaderfeed'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("relations named leaderfeed after watch and status: %d (%v), want none", n, err)
	}
}

// schema prints SQL that an administrator runs; run and status then work
// with --no-create.
func TestSchema(t *testing.T) {
	url := postgresURL(t)
	bin, _ := binaries(t)
	schema := uniqueName("lf_schema")
	t.Cleanup(func() { adminExec(t, url, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })
	applySchema(t, bin, url, "--schema", schema)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	election := uniqueName("schema")
	p := start(t, bin, io.Discard, append([]string{"run", "--store", url, "--election", election, "--schema", schema, "--no-create"},
		append(timingFlags, "--", "sh", "-c", "exit 0")...)...)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("run --no-create on the administrator's schema: exit %d\n%s", code, p.stderr.String())
	}
	if st := statusOf(t, bin, url, election, "--schema", schema); !st.Exists || st.Term != 1 {
		t.Fatalf("status: %+v, want term 1", st)
	}
	// Applied again over a table in use, the script changes nothing (the
	// postgres package's tests check the catalog and the locks).
	applySchema(t, bin, url, "--schema", schema)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`"."leaderfeed" WHERE election = $1`, election).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows of the election in the administrator's table: %d, %v", n, err)
	}
}

// Bad input: one line naming what is wrong, the documented exit code, and
// no CMD left running.
func TestBadInput(t *testing.T) {
	bin, _ := binaries(t)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	noExec := filepath.Join(dir, "noexec")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pg := "postgres://u@127.0.0.1:1/db" // nothing listens on port 1
	if u := os.Getenv("LEADERFEED_POSTGRES_URL"); u != "" {
		pg = u
	}
	touch := []string{"--", "sh", "-c", "touch " + marker}
	cases := []struct {
		name string
		args []string
		code int
		says string
	}{
		{"no command", nil, exitUsage, "Usage"},
		{"unknown command", []string{"elect"}, exitUsage, `unknown command "elect"`},
		{"malformed URL", append([]string{"run", "--store", "postgres://%zz", "--election", "e"}, touch...), exitUsage, "malformed postgres store URL"},
		{"unsupported scheme", append([]string{"run", "--store", "redis://h/0", "--election", "e"}, touch...), exitUsage, `unsupported store URL scheme "redis"`},
		{"rethinkdb without host", append([]string{"run", "--store", "rethinkdb:///db", "--election", "e"}, touch...), exitUsage, "has no host"},
		{"no store", append([]string{"run", "--election", "e"}, touch...), exitUsage, "no store: give --store URL, --store-file FILE or LEADERFEED_STORE"},
		{"both store flags", append([]string{"run", "--store", pg, "--store-file", marker, "--election", "e"}, touch...), exitUsage, "give --store or --store-file, not both"},
		{"no store file", append([]string{"run", "--store-file", marker, "--election", "e"}, touch...), exitUsage, "--store-file: open " + marker},
		{"rethinkdb unknown parameter", append([]string{"run", "--store", "rethinkdb://h/db?ssl=true", "--election", "e"}, touch...), exitUsage, `unknown parameter "ssl" (want tls=true, tlsCAFile=PATH)`},
		{"rethinkdb no CA file", append([]string{"run", "--store", "rethinkdb://h/db?tlsCAFile=" + marker, "--election", "e"}, touch...), exitUsage, "tlsCAFile: open " + marker},
		{"negative --max-outage", append([]string{"run", "--store", pg, "--election", "e", "--max-outage", "-1s"}, touch...), exitUsage, "bad --max-outage -1s"},
		{"missing --", []string{"run", "--store", pg, "--election", "e", "sh", "-c", "touch " + marker}, exitUsage, `put CMD after --`},
		{"missing -- and CMD", []string{"run", "--store", pg, "--election", "e"}, exitUsage, "missing -- before CMD"},
		{"bad election name", append([]string{"run", "--store", pg, "--election", strings.Repeat("x", 200)}, touch...), exitUsage, "bad --election"},
		{"bad timing", append([]string{"run", "--store", pg, "--election", "e", "--lease", "5s"}, touch...), exitUsage, "bad timing: heartbeat: invalid timing: --lease (5s) must be less than --election-timeout-min (2s, the default)"},
		// No --lease given: the problem is the heartbeat, not a lease of 0s.
		{"heartbeat over the default timeout", append([]string{"run", "--store", pg, "--election", "e", "--heartbeat", "5s"}, touch...), exitUsage,
			"bad timing: heartbeat: invalid timing: --election-timeout-min (2s, the default) must be greater than --heartbeat (5s)\n"},
		{"value too long", append([]string{"run", "--store", pg, "--election", "e", "--value", strings.Repeat("v", 3000)}, touch...), exitUsage, "--value is 3000 bytes, more than the limit (2048)"},
		{"unknown flag", append([]string{"run", "--store", pg, "--election", "e", "--colour"}, touch...), exitUsage, "flag provided but not defined"},
		{"priority out of range", append([]string{"run", "--store", pg, "--election", "e", "--priority", "101"}, touch...), exitUsage, "bad --priority 101: must be in [-100, 100]"},
		{"priority without presence", append([]string{"run", "--store", pg, "--election", "e", "--no-participate", "--priority", "0"}, touch...), exitUsage,
			"--priority needs the presence record that --no-participate leaves out"},
		{"CMD not found", []string{"run", "--store", pg, "--election", "e", "--", "no-such-command-xyz"}, exitNotFound, `CMD "no-such-command-xyz" not found`},
		{"CMD not executable", []string{"run", "--store", pg, "--election", "e", "--", noExec}, exitNotExec, "is not executable"},
		{"unreachable store", append([]string{"run", "--store", "postgres://u@127.0.0.1:1/db", "--election", "e", "--connect-timeout", "1s"}, touch...), exitUnreachable, "not reached within --connect-timeout 1s"},
		{"status unreachable", []string{"status", "--store", "postgres://u@127.0.0.1:1/db", "--election", "e", "--connect-timeout", "1s"}, exitUnreachable, "127.0.0.1:1"},
		{"watch unreachable", []string{"watch", "--store", "rethinkdb://127.0.0.1:1/db", "--election", "e", "--connect-timeout", "1s"}, exitUnreachable, "127.0.0.1:1"},
		{"schema of mongodb", []string{"schema", "--store", "mongodb://h/db"}, exitUsage, "only the postgres backend needs a script"},
		{"schema bad table", []string{"schema", "--store", "postgres://h/db", "--table", "a-b"}, exitUsage, `--table "a-b" is not a plain identifier`},
		{"status --no-create", []string{"status", "--store", pg, "--election", "e", "--no-create"}, exitUsage, "flag provided but not defined: -no-create"},
		{"status timing", []string{"status", "--store", pg, "--election", "e", "--lease", "1s"}, exitUsage, "flag provided but not defined: -lease"},
		{"status --log-level", []string{"status", "--store", pg, "--election", "e", "--log-level", "debug"}, exitUsage, "flag provided but not defined: -log-level"},
		{"watch --no-create", []string{"watch", "--store", pg, "--election", "e", "--no-create"}, exitUsage, "flag provided but not defined: -no-create"},
		{"watch timing", []string{"watch", "--store", pg, "--election", "e", "--heartbeat", "1s"}, exitUsage, "flag provided but not defined: -heartbeat"},
	}
	if os.Getenv("LEADERFEED_POSTGRES_URL") != "" {
		cases = append(cases, struct {
			name string
			args []string
			code int
			says string
		}{"status without the table", []string{"status", "--store", pg, "--election", "e", "--table", "no_such_table_xyz"}, exitRefused, "apply the output of `leaderfeed schema`"})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, tc.args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			cmd.Env = envWithout(storeEnv)
			started := time.Now()
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("exit: %v, want code %d; stderr %q", err, tc.code, stderr.String())
			}
			// An unreachable store is tried until --connect-timeout.
			if took := time.Since(started); tc.code == exitUnreachable && took < 900*time.Millisecond {
				t.Fatalf("gave up after %v, before --connect-timeout 1s", took)
			}
			// The error is one line, the last; before it, an unreachable
			// store's wait is logged (the library's lines, at Warn).
			lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
			msg := lines[len(lines)-1] + "\n"
			if tc.args == nil { // the usage
				msg = stderr.String()
			}
			checkCLIWords(t, msg)
			if tc.code == exitUnreachable && !strings.Contains(stderr.String(), `level=WARN msg="leaderfeed: store not reached, waiting"`) {
				t.Fatalf("the wait for the store is not logged: stderr %q", stderr.String())
			}
			// Warnings come before the error: the wait for the store, a
			// password given in --store (the test server's URL has one).
			lines = slices.DeleteFunc(lines, func(l string) bool { return strings.Contains(l, "level=WARN") })
			if tc.args != nil && len(lines) != 1 {
				t.Fatalf("stderr is not one line: %q", stderr.String())
			}
			if !strings.Contains(msg, tc.says) {
				t.Fatalf("stderr %q does not say %q", msg, tc.says)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("CMD ran")
			}
		})
	}
}

// Every command answers --help on stdout with exit code 0.
func TestHelp(t *testing.T) {
	bin, _ := binaries(t)
	for _, sub := range []string{"run", "status", "watch", "schema"} {
		out, err := exec.Command(bin, sub, "--help").Output()
		if err != nil {
			t.Fatalf("%s --help: %v", sub, err)
		}
		if !strings.Contains(string(out), "Usage: leaderfeed "+sub) || !strings.Contains(string(out), "Exit codes") || !strings.Contains(string(out), "-store") {
			t.Fatalf("%s --help printed %q", sub, out)
		}
	}
}
