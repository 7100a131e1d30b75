//go:build linux

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// The README's programs, as users copy them, across processes (issue 39).
// Each run starts three copies of one program on one machine against a
// database of its own, then, in a random order (LEADERFEED_SEED replays
// it), sends the leader SIGTERM readmeHandovers times and SIGKILL
// readmeKills times (5 and 2 with -short), starting a fresh copy after
// each, so that three run again. It runs each program twice: as the README
// has it (every copy has an id of its own, hostname and pid), and with the
// pid in the id replaced by 0, so that the three copies share one node id,
// as copies of the README's programs did before issue 39. The four runs go
// at once.
//
// The programs are taken from README.md's ```go blocks (the rule of
// scripts/check-docs.sh: a block whose code starts with package main), the
// one headed "// Command scheduler" and the one headed "// Command
// partitions", and built with this checkout. Two edits are made, and only
// these: the first statement of main sets the standard logger's flags to
// stamp each line to the microsecond in UTC (the programs log through it,
// at one-second precision), which changes nothing else; and, for the
// shared-id runs, os.Getpid() in the id becomes 0.
//
// What is checked comes from two sources. The copies' own logs: Run logs
// "leaderfeed: run: work started" before it calls the job and "work ended"
// after the job returned, so [started, ended] holds the job's run; the job
// logs "leading ..." when it starts. A killed copy's job ends when kill(2)
// returned. The logs of every copy go through Check (one machine, one wall
// clock: CLOCK_REALTIME stands in for Monotonic): no two jobs of one
// election overlap, terms increase, a job's line lies inside its run, and
// a new leader comes within the bound after each fault (the programs'
// ElectionTimeoutMax, 4 s, plus 2 s times LEADERFEED_TEST_SCALE). And the
// store's history: a trigger the test adds to the election table records
// every write (leader, term, incarnation) in the transaction that makes
// it. From it: every term is written by one incarnation only (no copy
// renews a term another won), every job's term was written under its
// copy's id, and each fault, from its signal to the next fault, changes
// the leader of an election at most once; more only where each term but
// the last ended with its lease running out, as on a starved machine it
// may (counted and logged). A shared-id run must log the duplicate id (the
// Error line "leaderfeed: node id is used by another process") in at
// least one copy; a run with distinct ids in none.
func TestREADMEPrograms(t *testing.T) {
	server := readmeServer(t)
	bins := buildREADMEPrograms(t)
	handovers, kills := readmeHandovers, readmeKills
	if testing.Short() {
		handovers, kills = 5, 2
	}
	// The runs go at once: their copies mostly wait on timers, and
	// t.Parallel would let -parallel (GOMAXPROCS) hold them back.
	var wg sync.WaitGroup
	for _, prog := range []string{"scheduler", "partitions"} {
		for _, shared := range []bool{false, true} {
			name, bin := prog+"/distinct-ids", bins[prog]
			if shared {
				name, bin = prog+"/shared-id", bins[prog+"-shared"]
			}
			wg.Go(func() {
				t.Run(name, func(t *testing.T) {
					newREADMERun(t, server, prog, shared, bin).run(handovers, kills)
				})
			})
		}
	}
	wg.Wait()
}

const (
	// readmeHandovers and readmeKills are the SIGTERMs and SIGKILLs of a
	// run.
	readmeHandovers = 20
	readmeKills     = 5
	readmeCopies    = 3
	faultSIGTERM    = "sigterm"
)

// The README programs' elections, by program.
var readmeElections = map[string][]string{
	"scheduler":  {"scheduler"},
	"partitions": {"p0", "p1", "p2"},
}

// readmeServer returns the URL of a PostgreSQL server on which the test
// may create databases: LEADERFEED_POSTGRES_URL's, else a private server
// (startPG: it fails in CI without one and skips elsewhere).
func readmeServer(t *testing.T) string {
	if u := os.Getenv("LEADERFEED_POSTGRES_URL"); u != "" {
		return u
	}
	s := startPG(t)
	return s.url(s.target())
}

// withDatabase returns the connection string u naming database db.
func withDatabase(u, db string) (string, error) {
	if !strings.HasPrefix(u, "postgres://") && !strings.HasPrefix(u, "postgresql://") {
		return u + " dbname=" + db, nil // keyword/value: the last one counts
	}
	p, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	p.Path, p.RawPath = "/"+db, ""
	return p.String(), nil
}

// readmeMicroseconds is the statement put first in main: the standard
// logger stamps its lines to the microsecond, in UTC.
const readmeMicroseconds = "log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)"

// readmeTimeLayout is the stamp readmeMicroseconds makes.
const readmeTimeLayout = "2006/01/02 15:04:05.000000"

// buildREADMEPrograms builds the README's programs scheduler and
// partitions, each as it is and, as NAME-shared, with one node id for
// every copy, and returns the binaries by name.
func buildREADMEPrograms(t *testing.T) map[string]string {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	progs := readmePrograms(string(readme))
	dir := t.TempDir()
	if err := readmeModule(dir); err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for _, name := range []string{"scheduler", "partitions"} {
		src, ok := progs[name]
		if !ok {
			t.Fatalf("README.md has no program headed %q (found %v)", "// Command "+name, slices.Sorted(maps.Keys(progs)))
		}
		fast, err := replaceOnce(src, "\nfunc main() {\n", "\nfunc main() {\n\t"+readmeMicroseconds+"\n")
		if err != nil {
			t.Fatalf("README.md's %s: %v", name, err)
		}
		shared, err := replaceOnce(fast, "os.Getpid()", "0")
		if err != nil {
			t.Fatalf("README.md's %s: the node id: %v", name, err)
		}
		for pkg, code := range map[string]string{name: fast, name + "-shared": shared} {
			if err := os.MkdirAll(filepath.Join(dir, pkg), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, pkg, "main.go"), []byte(code), 0o644); err != nil {
				t.Fatal(err)
			}
			pkgs = append(pkgs, "./"+pkg)
		}
	}
	args := []string{"build", "-o", filepath.Join(dir, "bin") + "/"}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of README.md's programs (in %s): %v\n%s", dir, err, out)
	}
	bins := map[string]string{}
	for _, p := range pkgs {
		bins[p[2:]] = filepath.Join(dir, "bin", p[2:])
	}
	return bins
}

// replaceOnce replaces old in s by new; old must occur exactly once.
func replaceOnce(s, old, new string) (string, error) {
	if n := strings.Count(s, old); n != 1 {
		return "", fmt.Errorf("%q occurs %d times, want once", old, n)
	}
	return strings.Replace(s, old, new, 1), nil
}

// readmePrograms returns the complete programs of a Markdown text by the
// name in their first line ("// Command NAME ..."): the ```go blocks whose
// code starts with package main, after comments and blank lines, as
// scripts/check-docs.sh finds them.
func readmePrograms(md string) map[string]string {
	progs := map[string]string{}
	var code []string
	in, isGo := false, false
	for line := range strings.Lines(md) {
		trimmed := strings.TrimSpace(line)
		switch {
		case !in && strings.HasPrefix(trimmed, "```"):
			in, isGo, code = true, trimmed == "```go", nil
		case in && trimmed == "```":
			in = false
			if isGo && isMainProgram(code) {
				if f := strings.Fields(code[0]); len(f) >= 3 && f[0] == "//" && f[1] == "Command" {
					progs[f[2]] = strings.Join(code, "")
				}
			}
		case in:
			code = append(code, line)
		}
	}
	return progs
}

func isMainProgram(code []string) bool {
	for _, l := range code {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "//") {
			continue
		}
		return l == "package main" || strings.HasPrefix(l, "package main ") || strings.HasPrefix(l, "package main//")
	}
	return false
}

// readmeModule makes dir a module that builds against this checkout: the
// integration module's requirements and go.sum (they cover pgx and every
// module of the checkout), its replace directives made absolute.
func readmeModule(dir string) error {
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return err
		}
	}
	out, err := exec.Command("go", "mod", "edit", "-json").Output()
	if err != nil {
		return fmt.Errorf("go mod edit -json: %w", err)
	}
	var mod struct {
		Replace []struct{ Old, New struct{ Path string } }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		return err
	}
	args := []string{"mod", "edit", "-module", "example.com/readmeprograms"}
	for _, r := range mod.Replace {
		p := r.New.Path
		if strings.HasPrefix(p, ".") {
			if p, err = filepath.Abs(p); err != nil {
				return err
			}
		}
		args = append(args, "-replace", r.Old.Path+"="+p)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go mod edit: %v\n%s", err, out)
	}
	return nil
}

// readmeRun is one run: three copies of one program on a database of its
// own.
type readmeRun struct {
	t         *testing.T
	label     string
	shared    bool
	bin       string
	url       string // of the run's database
	host      string
	elections []string
	timing    heartbeat.Timing // the programs' (the default)
	bound     time.Duration
	seed      uint64
	rng       *rand.Rand
	hist      *pgxpool.Pool

	mu      sync.Mutex
	changed chan struct{}
	procs   []*readmeProc // every copy started
	live    []*readmeProc // the copies that run
	faults  []*readmeFault
}

// readmeProc is one copy of the program.
type readmeProc struct {
	name   string // c1, c2, ...: unique in the run
	id     string // its node id
	cmd    *exec.Cmd
	stdout *tail
	done   chan struct{}

	// Guarded by readmeRun.mu.
	lines      map[string][]Line   // by election: work started (elected), ended (unelected), the job's line (act)
	open       map[string]uint64   // by election: the term of the job that runs
	feedUp     map[string]bool     // by election: the changefeed started
	leaseLost  map[string][]uint64 // by election: terms it lost to its lease running out
	dups       int                 // Error lines: the node id is used by another process
	bad        []string            // lines that are not the standard logger's
	raw        []string            // every line, for a failure
	signalled  bool                // the test sent it SIGTERM or SIGKILL
	killed     int64               // when kill(2) returned
	end        int64               // when it had certainly ended
	waitErr    error
	exitedSelf bool // ended before the test signalled it
}

// readmeFault is one SIGTERM or SIGKILL of the leader.
type readmeFault struct {
	kind   string
	victim *readmeProc
	at     int64             // wall clock, before the signal
	mark   int64             // the last history row before the signal
	led    map[string]uint64 // the elections the victim led, and its terms
}

func newREADMERun(t *testing.T, server, prog string, shared bool, bin string) *readmeRun {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	tm := heartbeat.Timing{}.WithDefaults() // the programs' Options has no Timing
	r := &readmeRun{
		t: t, shared: shared, bin: bin, host: host, elections: readmeElections[prog],
		timing:  tm,
		bound:   tm.ElectionTimeoutMax + basetest.Scaled(2*time.Second),
		seed:    seed(),
		changed: make(chan struct{}),
	}
	r.label = prog + ", distinct ids"
	if shared {
		r.label = prog + ", one shared id"
	}
	r.rng = rand.New(rand.NewPCG(r.seed, r.seed^0x9e3779b97f4a7c15))

	ctx, cancel := context.WithTimeout(context.Background(), basetest.Scaled(30*time.Second))
	defer cancel()
	db := fmt.Sprintf("lf_readme_%s_%s_%x", prog, map[bool]string{false: "distinct", true: "shared"}[shared], rand.Uint32())
	adminExec := func(sql string) error {
		ctx, cancel := context.WithTimeout(context.Background(), basetest.Scaled(30*time.Second))
		defer cancel()
		conn, err := pgx.Connect(ctx, server)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := adminExec(`CREATE DATABASE "` + db + `"`); err != nil {
		t.Fatalf("create the run's database: %v", err)
	}
	t.Cleanup(func() {
		if err := adminExec(`DROP DATABASE "` + db + `" WITH (FORCE)`); err != nil {
			t.Logf("drop database %s: %v", db, err)
		}
	})
	// Whatever happened, no copy is left behind, before the database goes.
	t.Cleanup(r.killAll)
	if r.url, err = withDatabase(server, db); err != nil {
		t.Fatal(err)
	}
	// The election table as the programs would create it, and the history.
	if err := pgPrepare(ctx, r.url, r.elections[0]); err != nil {
		t.Fatalf("create the election table: %v", err)
	}
	if r.hist, err = pgxpool.New(ctx, r.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.hist.Close)
	if _, err := r.hist.Exec(ctx, readmeHistorySQL); err != nil {
		t.Fatalf("history trigger: %v", err)
	}
	return r
}

// readmeHistorySQL records every write of the election table, in the
// transaction that makes it; per election, the ids follow the order of
// the writes (each waits for the row lock of the one before).
const readmeHistorySQL = `
CREATE TABLE lf_history (
  id bigserial PRIMARY KEY,
  election text NOT NULL,
  leader text NOT NULL,
  term bigint NOT NULL,
  revision bigint NOT NULL,
  incarnation bigint NOT NULL,
  handover bigint NOT NULL,
  at timestamptz NOT NULL
);
CREATE FUNCTION lf_history_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO lf_history (election, leader, term, revision, incarnation, handover, at)
  VALUES (NEW.election, NEW.leader, NEW.term, NEW.revision, NEW.incarnation, NEW.handover, clock_timestamp());
  RETURN NULL;
END
$$;
CREATE TRIGGER lf_history AFTER INSERT OR UPDATE ON public.leaderfeed
  FOR EACH ROW EXECUTE FUNCTION lf_history_add();
`

// readmeWrite is one row of the history.
type readmeWrite struct {
	id          int64
	election    string
	leader      string
	term        int64
	revision    int64
	incarnation int64
	handover    int64
	at          time.Time
}

func (w readmeWrite) String() string {
	return fmt.Sprintf("#%d %s leader=%q term=%d rev=%d inc=%d handover=%d at %s",
		w.id, w.election, w.leader, w.term, w.revision, w.incarnation, w.handover, w.at.UTC().Format(readmeTimeLayout))
}

func (r *readmeRun) lastWrite() (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), basetest.Scaled(10*time.Second))
	defer cancel()
	var id int64
	err := r.hist.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM lf_history`).Scan(&id)
	return id, err
}

func (r *readmeRun) history() ([]readmeWrite, error) {
	ctx, cancel := context.WithTimeout(context.Background(), basetest.Scaled(10*time.Second))
	defer cancel()
	rows, err := r.hist.Query(ctx, `SELECT id, election, leader, term, revision, incarnation, handover, at FROM lf_history ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (readmeWrite, error) {
		var w readmeWrite
		err := row.Scan(&w.id, &w.election, &w.leader, &w.term, &w.revision, &w.incarnation, &w.handover, &w.at)
		return w, err
	})
}

func (r *readmeRun) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// start starts a copy of the program.
func (r *readmeRun) start() error {
	cmd := exec.Command(r.bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+r.url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &readmeProc{cmd: cmd, stdout: &tail{}, done: make(chan struct{}),
		lines: map[string][]Line{}, open: map[string]uint64{}, feedUp: map[string]bool{}, leaseLost: map[string][]uint64{}}
	cmd.Stdout = p.stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	p.id = fmt.Sprintf("%s-%d", r.host, cmd.Process.Pid)
	if r.shared {
		p.id = r.host + "-0"
	}
	r.mu.Lock()
	p.name = fmt.Sprintf("c%d", len(r.procs)+1)
	r.procs = append(r.procs, p)
	r.live = append(r.live, p)
	r.notify()
	r.mu.Unlock()
	go r.read(p, stderr)
	return nil
}

// The lines of the standard logger that the checks read: Run's, the
// engine's and the job's ("leading, term N"; "leading p0, term N").
const (
	readmeWorkStarted = "INFO leaderfeed: run: work started "
	readmeWorkEnded   = "INFO leaderfeed: run: work ended "
	readmeFeedStarted = "INFO leaderfeed: changefeed started "
	readmeUnelected   = "INFO leaderfeed: unelected "
	readmeDuplicate   = "ERROR leaderfeed: node id is used by another process "
)

var readmeJobLine = regexp.MustCompile(`^leading(?: (\S+))?, term (\d+)$`)

// read takes in the log of p until it ends, then waits for p.
func (r *readmeRun) read(p *readmeProc, out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		r.mu.Lock()
		r.take(p, sc.Text())
		r.notify()
		r.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, out)
	err := p.cmd.Wait()
	end := time.Now().UnixNano()
	r.mu.Lock()
	p.end, p.waitErr, p.exitedSelf = end, err, !p.signalled
	clear(p.open)
	r.live = slices.DeleteFunc(r.live, func(q *readmeProc) bool { return q == p })
	r.notify()
	r.mu.Unlock()
	close(p.done)
}

// take takes in one line of p's log; r.mu is held.
func (r *readmeRun) take(p *readmeProc, s string) {
	p.raw = append(p.raw, s)
	if len(s) <= len(readmeTimeLayout) || s[len(readmeTimeLayout)] != ' ' {
		p.bad = append(p.bad, s)
		return
	}
	at, err := time.Parse(readmeTimeLayout, s[:len(readmeTimeLayout)])
	if err != nil {
		p.bad = append(p.bad, s)
		return
	}
	mono, msg := at.UnixNano(), s[len(readmeTimeLayout)+1:]
	election, term := readmeAttr(msg, "election"), readmeAttr(msg, "term")
	n, termErr := strconv.ParseUint(term, 10, 64)
	switch {
	case strings.HasPrefix(msg, readmeWorkStarted) && termErr == nil:
		p.lines[election] = append(p.lines[election], Line{Mono: mono, Kind: KindElected, Term: n})
		p.open[election] = n
	case strings.HasPrefix(msg, readmeWorkEnded) && termErr == nil:
		p.lines[election] = append(p.lines[election], Line{Mono: mono, Kind: KindUnelected, Term: n, Reason: "work-ended"})
		if p.open[election] == n {
			delete(p.open, election)
		}
	case strings.HasPrefix(msg, readmeWorkStarted), strings.HasPrefix(msg, readmeWorkEnded):
		p.bad = append(p.bad, s)
	case strings.HasPrefix(msg, readmeFeedStarted):
		p.feedUp[election] = true
	case strings.HasPrefix(msg, readmeUnelected) && readmeAttr(msg, "reason") == "lease-expired" && termErr == nil:
		p.leaseLost[election] = append(p.leaseLost[election], n)
	case strings.HasPrefix(msg, readmeDuplicate):
		p.dups++
	default:
		if m := readmeJobLine.FindStringSubmatch(msg); m != nil {
			e := m[1]
			if e == "" {
				e = r.elections[0]
			}
			n, _ := strconv.ParseUint(m[2], 10, 64)
			p.lines[e] = append(p.lines[e], Line{Mono: mono, Kind: KindAct, Term: n, First: mono, Last: mono, Count: 1})
		}
	}
}

// readmeAttr returns the value of attribute key in a line of slog's
// default handler (up to the next space), or "".
func readmeAttr(msg, key string) string {
	i := strings.Index(msg, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := msg[i+len(key)+2:]
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}

// waitFor waits until cond (called with r.mu held) is true.
func (r *readmeRun) waitFor(what string, timeout time.Duration, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok, ch := cond(), r.changed
		r.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("timed out after %v waiting for %s\n%s", timeout, what, r.state())
		}
	}
}

// leaderLocked returns the one copy whose job of election runs, if exactly
// one's does.
func (r *readmeRun) leaderLocked(election string) *readmeProc {
	var l *readmeProc
	for _, p := range r.live {
		if p.open[election] != 0 {
			if l != nil {
				return nil
			}
			l = p
		}
	}
	return l
}

// stable waits until three copies run, each with its changefeed up, and
// each election has one leader.
func (r *readmeRun) stable() error {
	return r.waitFor("three copies, their feeds up and one leader per election", r.bound+basetest.Scaled(10*time.Second), func() bool {
		if len(r.live) != readmeCopies {
			return false
		}
		for _, e := range r.elections {
			if r.leaderLocked(e) == nil {
				return false
			}
			for _, p := range r.live {
				if !p.feedUp[e] {
					return false
				}
			}
		}
		return true
	})
}

func (r *readmeRun) state() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, p := range r.live {
		fmt.Fprintf(&b, "  %s (%s): jobs %v, feeds %v", p.name, p.id, p.open, p.feedUp)
		if n := len(p.raw); n > 0 {
			fmt.Fprintf(&b, ", last: %s", p.raw[n-1])
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// run starts the copies, sends the signals and checks what happened.
func (r *readmeRun) run(handovers, kills int) {
	t := r.t
	t.Logf("%s: %d copies, %d SIGTERMs and %d SIGKILLs of the leader, bound %v, seed %d", r.label, readmeCopies, handovers, kills, r.bound, r.seed)
	began := time.Now()
	for range readmeCopies {
		if err := r.start(); err != nil {
			t.Fatal(err)
		}
	}
	var plan []string
	for range handovers {
		plan = append(plan, faultSIGTERM)
	}
	for range kills {
		plan = append(plan, faultKill)
	}
	r.rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	for i, kind := range plan {
		if err := r.inject(kind); err != nil {
			t.Errorf("fault %d of %d (%s): %v", i+1, len(plan), kind, err)
			break
		}
	}
	// Every copy up, so that each has its handler of SIGTERM, and the last
	// fault's window as long as the others.
	if err := r.settle(); err != nil {
		t.Error(err)
	}
	final, err := r.lastWrite()
	if err != nil {
		t.Error(err)
	}
	r.stopAll()
	elapsed := time.Since(began)
	r.check(final, elapsed)
}

// settle waits until every copy is up and each election has a leader,
// then for a random 1 to 2 heartbeat intervals, so that the window of a
// fault, up to the next, holds at least a heartbeat of every copy (issue
// 39's third copy took over a second after the handover), and varies the
// phase of the next fault against the heartbeats.
func (r *readmeRun) settle() error {
	if err := r.stable(); err != nil {
		return err
	}
	hb := r.timing.HeartbeatInterval
	time.Sleep(hb + time.Duration(r.rng.Int64N(int64(hb))))
	return r.stable()
}

// inject sends the leader SIGTERM or SIGKILL once the copies have settled,
// waits for its end and for a new leader of every election it led, and
// starts a fresh copy.
func (r *readmeRun) inject(kind string) error {
	if err := r.settle(); err != nil {
		return err
	}
	mark, err := r.lastWrite()
	if err != nil {
		return err
	}
	r.mu.Lock()
	victim := r.leaderLocked(r.elections[0])
	if victim == nil { // it changed since stable
		r.mu.Unlock()
		return r.inject(kind)
	}
	f := &readmeFault{kind: kind, victim: victim, mark: mark, led: map[string]uint64{}}
	for _, e := range r.elections {
		if term := victim.open[e]; term != 0 {
			f.led[e] = term
		}
	}
	victim.signalled = true
	f.at = time.Now().UnixNano()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
	if kind == faultKill {
		err = victim.cmd.Process.Signal(syscall.SIGKILL)
		at := time.Now().UnixNano() // once kill(2) returned, it runs no more code
		r.mu.Lock()
		victim.killed = at
		r.mu.Unlock()
	} else {
		err = victim.cmd.Process.Signal(syscall.SIGTERM)
	}
	if err != nil {
		return err
	}
	select {
	case <-victim.done:
	case <-time.After(r.bound + basetest.Scaled(5*time.Second)):
		return fmt.Errorf("%s did not end after %s", victim.name, kind)
	}
	if err := r.waitFor("a new leader of each election the victim led", r.bound+basetest.Scaled(5*time.Second), func() bool {
		for e, term := range f.led {
			l := r.leaderLocked(e)
			if l == nil || l.open[e] <= term {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	return r.start()
}

// stopAll sends every copy SIGTERM, as the end of a deploy, and waits for
// them; one still running after the bound is killed.
func (r *readmeRun) stopAll() {
	r.mu.Lock()
	live := slices.Clone(r.live)
	for _, p := range live {
		p.signalled = true
	}
	r.mu.Unlock()
	for _, p := range live {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	timeout := time.After(r.bound + basetest.Scaled(5*time.Second))
	for _, p := range live {
		select {
		case <-p.done:
		case <-timeout:
			r.t.Errorf("%s did not end after SIGTERM; killed", p.name)
			r.killAll()
			return
		}
	}
}

// killAll kills every copy still running and waits for it.
func (r *readmeRun) killAll() {
	r.mu.Lock()
	procs := slices.Clone(r.procs)
	for _, p := range procs {
		p.signalled = true
	}
	r.mu.Unlock()
	for _, p := range procs {
		if p.cmd.Process != nil {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	for _, p := range procs {
		<-p.done
	}
}

// check checks the logs and the history, and logs a summary.
func (r *readmeRun) check(final int64, elapsed time.Duration) {
	t := r.t
	hist, err := r.history()
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	// The copies' logs, one election at a time.
	overlaps := 0
	ttl := map[string][]time.Duration{}
	for _, e := range r.elections {
		var logs []NodeLog
		for _, p := range r.procs {
			logs = append(logs, NodeLog{Proc: p.name, Lines: p.lines[e], End: p.end, Killed: p.killed})
		}
		var faults []Fault
		for _, f := range r.faults {
			if _, ok := f.led[e]; ok {
				faults = append(faults, Fault{Kind: f.kind, Seq: len(faults) + 1, Victim: f.victim.name, At: f.at, NewLeader: true})
			}
		}
		rep := Check(logs, faults, r.bound)
		overlaps += len(rep.Overlaps)
		if err := rep.Err(); err != nil {
			fail("election %s: %v", e, err)
		}
		for i, f := range faults {
			ttl[f.Kind] = append(ttl[f.Kind], rep.TimeToLeader[i])
		}
	}

	// The copies themselves.
	dups := 0
	for _, p := range r.procs {
		if p.dups > 0 {
			dups++
		}
		for _, b := range p.bad {
			fail("%s printed a line that is not the standard logger's: %s", p.name, b)
		}
		switch {
		case p.exitedSelf:
			fail("%s ended before it was signalled: %v", p.name, p.waitErr)
		case p.killed == 0 && p.waitErr != nil:
			fail("%s ended with %v after SIGTERM, want exit status 0", p.name, p.waitErr)
		}
		if s := p.stdout.String(); s != "" {
			fail("%s printed on stdout: %s", p.name, s)
		}
	}
	switch {
	case r.shared && dups == 0:
		fail("no copy logged %q, with %d copies sharing the node id %s", strings.TrimSpace(readmeDuplicate), len(r.procs), r.host+"-0")
	case !r.shared && dups > 0:
		fail("%d copies logged %q with distinct ids", dups, strings.TrimSpace(readmeDuplicate))
	}

	// The history: one incarnation per term, terms never decreasing, the
	// jobs' terms written under their ids.
	type key struct {
		e    string
		term int64
	}
	owner := map[key]readmeWrite{}
	top := map[string]int64{}
	for _, w := range hist {
		if w.term < top[w.election] {
			fail("the term went back from %d: %v", top[w.election], w)
		}
		top[w.election] = max(top[w.election], w.term)
		if w.leader == "" {
			continue
		}
		k := key{w.election, w.term}
		if o, ok := owner[k]; !ok {
			owner[k] = w
		} else if o.incarnation != w.incarnation || o.leader != w.leader {
			fail("term %d of %s written by two processes:\n    %v\n    %v", w.term, w.election, o, w)
		}
	}
	for _, p := range r.procs {
		for e, lines := range p.lines {
			for _, l := range lines {
				if l.Kind != KindElected {
					continue
				}
				if o, ok := owner[key{e, int64(l.Term)}]; !ok || o.leader != p.id {
					fail("%s (%s) ran the job of %s term %d, which the store has as %v", p.name, p.id, e, l.Term, o)
				}
			}
		}
	}

	// Leader changes per fault, from the fault to the next one. More than
	// one is excused only where every term but the last of them ended
	// with its lease running out, as on a starved machine it may; it is
	// counted and logged.
	leaseLost := map[key]bool{}
	for _, p := range r.procs {
		for e, terms := range p.leaseLost {
			for _, term := range terms {
				leaseLost[key{e, int64(term)}] = true
			}
		}
	}
	var excused []string
	changes := map[string]map[int]int{} // kind -> changes -> how many (fault, election)
	writes := map[string]map[int]int{}  // kind -> writes up to the new leader's first -> how many
	for i, f := range r.faults {
		next := final
		if i+1 < len(r.faults) {
			next = r.faults[i+1].mark
		}
		for _, e := range r.elections {
			var before int64
			var window []readmeWrite
			for _, w := range hist {
				switch {
				case w.election != e:
				case w.id <= f.mark:
					before = max(before, w.term)
				case w.id <= next:
					window = append(window, w)
				}
			}
			// Leader changes: the terms won after the fault. Writes: those
			// up to the first of them, but the old leader's renewals.
			terms, toFirst, n := map[int64]bool{}, 0, 0
			for _, w := range window {
				if w.leader != "" && w.term == before {
					continue // a renewal
				}
				n++
				if w.leader != "" && w.term > before {
					if len(terms) == 0 {
						toFirst = n
					}
					terms[w.term] = true
				}
			}
			if len(terms) > 1 {
				var b strings.Builder
				for _, w := range window {
					b.WriteString("\n    " + w.String())
				}
				msg := fmt.Sprintf("%s of %s (fault %d) changed the leader of %s %d times; the writes until the next fault:%s",
					f.kind, f.victim.name, i+1, e, len(terms), b.String())
				last, lost := slices.Max(slices.Collect(maps.Keys(terms))), true
				for term := range terms {
					lost = lost && (term == last || leaseLost[key{e, term}])
				}
				if lost {
					excused = append(excused, msg)
				} else {
					fail("%s", msg)
				}
			}
			if _, ok := f.led[e]; !ok {
				continue
			}
			if changes[f.kind] == nil {
				changes[f.kind], writes[f.kind] = map[int]int{}, map[int]int{}
			}
			changes[f.kind][len(terms)]++
			writes[f.kind][toFirst]++
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d faults in %v, %d copies (%d logged the duplicate id), %d writes, load %s",
		r.label, len(r.faults), elapsed.Round(time.Second), len(r.procs), dups, len(hist), loadavg())
	fmt.Fprintf(&b, "\n  overlapping jobs: %d; faults with more than one leader change after leases lost to starvation: %d", overlaps, len(excused))
	for _, m := range excused {
		b.WriteString("\n  " + m)
	}
	for _, kind := range []string{faultSIGTERM, faultKill} {
		fmt.Fprintf(&b, "\n  %s: leader changes per election led %v, writes to the new leader's first (renewals aside) %v, time to leader median %s, p99 %s, worst %s",
			kind, counts(changes[kind]), counts(writes[kind]), pct(ttl[kind], 0.5), pct(ttl[kind], 0.99), pct(ttl[kind], 1))
	}
	t.Log(b.String())
	if len(problems) > 0 {
		r.keepLogs(hist)
		t.Error(strings.Join(problems, "\n"))
	}
}

// counts formats a histogram as "value×count ...".
func counts(m map[int]int) string {
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d×%d", v, m[v]))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// keepLogs writes every copy's log, the faults and the history into a
// directory that outlives the test; r.mu is held.
func (r *readmeRun) keepLogs(hist []readmeWrite) {
	dir, err := os.MkdirTemp("", "leaderfeed-it-readme.")
	if err != nil {
		r.t.Log(err)
		return
	}
	var b strings.Builder
	for i, f := range r.faults {
		fmt.Fprintf(&b, "%d %s %s at %s mark %d led %v\n", i+1, f.kind, f.victim.name,
			time.Unix(0, f.at).UTC().Format(readmeTimeLayout), f.mark, f.led)
	}
	_ = os.WriteFile(filepath.Join(dir, "faults.txt"), []byte(b.String()), 0o644)
	b.Reset()
	for _, w := range hist {
		b.WriteString(w.String() + "\n")
	}
	_ = os.WriteFile(filepath.Join(dir, "history.txt"), []byte(b.String()), 0o644)
	for _, p := range r.procs {
		s := strings.Join(p.raw, "\n") + fmt.Sprintf("\nid %s killed %d end %d wait %v\n", p.id, p.killed, p.end, p.waitErr)
		_ = os.WriteFile(filepath.Join(dir, p.name+".log"), []byte(s), 0o644)
	}
	r.t.Logf("logs, faults and history kept in %s", dir)
}
