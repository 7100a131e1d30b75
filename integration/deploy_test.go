//go:build linux

package integration

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Deploys (issue 41): a rolling restart moves leadership once, never to a
// node that is leaving.
//
// Both tests run node processes (./node) that participate
// (base.Options.Participate) with the library's default timing and
// PresenceInterval, against PostgreSQL (LEADERFEED_POSTGRES_URL, else a
// private server; a database of their own), and stop them with SIGTERM as
// a deploy does. The nodes are built without -race even when the tests
// run with it: the tests measure how long a handover takes, and start 100
// processes each, which the race detector makes several times slower
// (the other tests run the node program with it). Each process's node id names its generation and place,
// "g03-n2": a new node's id sorts after every old one's, so that a
// successor chosen by the lowest node id is always an old node, the one
// a rollout stops next.
//
// What is measured comes from two sources. The nodes' logs go through
// Check: no two leaderships overlap, terms increase, no job acts outside
// its term; from the intervals, each leaderless gap, from the end of one
// term (the old leader's EventUnelected, which Stop reports first) to the
// start of the next. And the store's history: a trigger the test adds to
// the election table records every write of the election record, every
// insert and delete of a presence record (a join and a withdrawal) and a
// participant's first presence write that carries a handover token
// (TOKEN: a leader skips a participant without one), in the transaction
// that makes it, so in the order of the rows' locks.
//
// A gap fails the test when it is longer than deployStarvedCap (scaled):
// a handover that fell back to a lease or an election timeout, or a
// record naming a node that left, takes seconds. Each gap is logged with
// deployGap (10 ms, what issue 41 asks of an idle machine) times
// LEADERFEED_TEST_SCALE, stretched by the load measured around it as
// faults_test.go stretches its liveness bound (loadSampler), and the
// gaps over it are counted, not failed: the tests run beside the other
// packages' tests, and a 20 ms sample of the run queue misses their
// bursts (a CI run at load 5 had a withdrawal take 8 ms in a window the
// sampler found idle). The idle figure is a benchmark's (bench/run.sh,
// rolling restarts) and this log's on a quiet machine. Safety takes no
// bound.

const (
	deployNodes = 5
	// rolloutsInCI and shrinksInCI are the runs of a test that is not
	// -short (5 and 2 with -short).
	rolloutsInCI = 20
	shrinksInCI  = 6
	// deployGap is the longest leaderless gap of a handover on an idle
	// machine (issue 41).
	deployGap = 10 * time.Millisecond
	// deployStarvedCap bounds a gap however loaded the machine was: far
	// above scheduling delays, far below an election timeout.
	deployStarvedCap = time.Second
)

// gapCap is deployStarvedCap, scaled: the longest gap a test accepts.
func gapCap() time.Duration { return basetest.Scaled(deployStarvedCap) }

// TestRolloutPostgres: rolling restarts. Five nodes run; a rollout starts a
// new node, waits until it participates (its Start returned, which makes
// its first presence write, and its changefeed is up), then sends SIGTERM
// to the oldest old node and waits for its end, five times, until all five
// are new. The leader at the start of each is an old node (all are).
// rolloutsInCI rollouts in a row on one election. Per rollout: leadership
// moves exactly once (the terms begun in the rollout, counted from the
// nodes' logs and from the store's history, which must agree); a move
// that follows a term lost to its lease running out, as on a starved
// machine it may, is counted and logged apart, not failed. No gap waits
// for a lease or an election timeout (see above), and every gap is
// logged with its parts. No write
// names a node that had left, and the record names none once its process
// has ended (namedGone).
func TestRolloutPostgres(t *testing.T) {
	n := rolloutsInCI
	if testing.Short() {
		n = 5
	}
	r := newDeployRun(t, "rollout")
	old, err := r.startGeneration()
	if err != nil {
		t.Fatal(err)
	}
	var rolls []*rollout
	for i := range n {
		ro, next, err := r.rollout(i+1, old)
		if ro != nil {
			rolls = append(rolls, ro)
		}
		if err != nil {
			t.Errorf("rollout %d of %d: %v", i+1, n, err)
			break
		}
		old = next
		if i == n-1 {
			// The last rollout's window ends once its leader leads.
			if err := r.settle(old); err != nil {
				t.Error(err)
			}
		}
	}
	endAt, endMark := r.end()
	r.checkRollouts(rolls, endAt, endMark)
}

// TestShrinkPostgres: stopping nodes with no new one started between, a
// shrink from five nodes to one, shrinksInCI times on one election (each
// with five fresh nodes). Each shrink stops, one at a time, waiting for
// each to end: the node the leader would hand over to, then the leader,
// then again the one it would hand over to, then the leader; in odd
// shrinks the one the leader would hand over to is the node that joined
// last (the choice of issue 41), in even ones the lowest node id (the
// choice before it). The checks: the store never names as leader, or as
// the successor of a vacancy, a node whose presence was withdrawn before
// that write or whose process had ended, and the record names no node
// once its process has ended (the stops do not overlap, so no write is in
// flight across a withdrawal: namedGone); each leader's stop hands over
// in one write (the record names the successor with the new term),
// waiting for no lease or election timeout.
func TestShrinkPostgres(t *testing.T) {
	n := shrinksInCI
	if testing.Short() {
		n = 2
	}
	r := newDeployRun(t, "shrink")
	var shrinks []*shrink
	for i := range n {
		s, err := r.shrink(i + 1)
		if s != nil {
			shrinks = append(shrinks, s)
		}
		if err != nil {
			t.Errorf("shrink %d of %d: %v", i+1, n, err)
			break
		}
	}
	endAt, endMark := r.end()
	r.checkShrinks(shrinks, endAt, endMark)
}

// deployRun is the run of one test: its nodes, database and history.
type deployRun struct {
	t    *testing.T
	h    *harness
	hist *pgxpool.Pool
	load *loadSampler
	rng  *rand.Rand
	gen  int           // generation of the nodes started last (their ids)
	gap  time.Duration // deployGap, scaled (before the load stretches it)
	// presenceInterval is the nodes' (the default).
	presenceInterval time.Duration
	// joined lists every process started, in the order each joined.
	joined []*proc
	// ended gives, by node id, the last history row once the node's
	// process had been seen to end.
	ended map[string]int64
	// wallOffset is the wall clock less Monotonic, to place the store's
	// timestamps (one machine, one wall clock) on the nodes' time line.
	wallOffset int64
}

// wallOffset returns the wall clock (CLOCK_REALTIME, which the server's
// clock_timestamp() reads) less Monotonic, from the closest of a few
// readings.
func wallOffset() int64 {
	var off int64
	best := int64(-1)
	for range 20 {
		a := Monotonic()
		w := time.Now().UnixNano()
		b := Monotonic()
		if best < 0 || b-a < best {
			best, off = b-a, w-(a+b)/2
		}
	}
	return off
}

// urlServer is a PostgreSQL database the nodes reach without proxies (the
// deploy tests inject no faults).
type urlServer struct{ url string }

func (urlServer) name() string              { return "postgres" }
func (urlServer) targets() []string         { return nil }
func (s urlServer) nodeURL([]string) string { return s.url }
func (s urlServer) prepare(ctx context.Context, election string) error {
	return pgPrepare(ctx, s.url, election)
}
func (urlServer) restart(context.Context) error                    { return errUnsupported }
func (urlServer) killFeeds(context.Context, []string) (int, error) { return 0, errUnsupported }
func (urlServer) failover(context.Context) (int64, int64, error)   { return 0, 0, errUnsupported }

func newDeployRun(t *testing.T, label string) *deployRun {
	server := readmeServer(t) // LEADERFEED_POSTGRES_URL, else a private server
	ctx, cancel := context.WithTimeout(context.Background(), basetest.Scaled(30*time.Second))
	defer cancel()
	db := fmt.Sprintf("lf_deploy_%s_%x", label, rand.Uint32())
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
		t.Fatalf("create the test's database: %v", err)
	}
	// Registered before the harness's cleanup, so it runs after every
	// node has ended.
	t.Cleanup(func() {
		if err := adminExec(`DROP DATABASE "` + db + `" WITH (FORCE)`); err != nil {
			t.Logf("drop database %s: %v", db, err)
		}
	})
	u, err := withDatabase(server, db)
	if err != nil {
		t.Fatal(err)
	}
	tm := heartbeat.Timing{}.WithDefaults()
	cfg := config{
		nodes:    2 * deployNodes, // two generations during a rollout
		timing:   tm,
		bound:    tm.ElectionTimeoutMax + basetest.Scaled(2*time.Second),
		election: "deploy",
		seed:     seed(),
		label:    "postgres, " + label + ", default timing, participants",
	}
	r := &deployRun{t: t, gap: basetest.Scaled(deployGap), ended: map[string]int64{}, wallOffset: wallOffset(),
		presenceInterval: max(tm.LeaseDuration/4, heartbeat.MinDuration)}
	r.rng = rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x9e3779b97f4a7c15))
	srv := urlServer{url: u}
	if err := srv.prepare(ctx, cfg.election); err != nil {
		t.Fatalf("create the election table: %v", err)
	}
	if r.hist, err = pgxpool.New(ctx, u); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.hist.Close)
	if _, err := r.hist.Exec(ctx, deployHistorySQL); err != nil {
		t.Fatalf("history trigger: %v", err)
	}
	r.h = newHarness(t, srv, cfg)
	r.h.idOf = func(slot int) string { return fmt.Sprintf("g%02d-n%d", r.gen, slot%deployNodes+1) }
	r.h.command = func(id string) *exec.Cmd {
		cmd := exec.Command(plainNodeBinary(t), "-backend", "postgres", "-election", cfg.election, "-id", id,
			"-heartbeat", "0s", "-emin", "0s", "-emax", "0s", "-participate")
		cmd.Env = append(os.Environ(), "LEADERFEED_NODE_URL="+u)
		return cmd
	}
	r.load = startLoadSampler()
	t.Cleanup(func() {
		select {
		case <-r.load.done:
		default:
			r.load.close()
		}
	})
	t.Logf("load at the start %s", loadavg())
	return r
}

// deployHistorySQL records every write of an election record, every
// insert and delete of a presence record (keys with chr(31); their
// refreshes are updates and left out) and, as op TOKEN, a presence
// record's first write with a token (the "k" of its JSON value), in the
// transaction that makes it.
const deployHistorySQL = `
CREATE TABLE lf_deploys (
  id bigserial PRIMARY KEY,
  op text NOT NULL,
  key text NOT NULL,
  leader text NOT NULL,
  term bigint NOT NULL,
  successor text NOT NULL,
  handover bigint NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION lf_deploys_add() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    INSERT INTO lf_deploys (op, key, leader, term, successor, handover)
    VALUES (TG_OP, OLD.election, OLD.leader, OLD.term, OLD.successor, OLD.handover);
  ELSIF TG_OP = 'INSERT' OR strpos(NEW.election, chr(31)) = 0 THEN
    INSERT INTO lf_deploys (op, key, leader, term, successor, handover)
    VALUES (TG_OP, NEW.election, NEW.leader, NEW.term, NEW.successor, NEW.handover);
  END IF;
  -- A participant's first presence write with a handover token.
  IF TG_OP <> 'DELETE' AND strpos(NEW.election, chr(31)) > 0
      AND convert_from(NEW.value, 'UTF8')::jsonb->>'k' IS NOT NULL
      AND (TG_OP = 'INSERT' OR convert_from(OLD.value, 'UTF8')::jsonb->>'k' IS NULL) THEN
    INSERT INTO lf_deploys (op, key, leader, term, successor, handover)
    VALUES ('TOKEN', NEW.election, NEW.leader, NEW.term, NEW.successor, NEW.handover);
  END IF;
  RETURN NULL;
END
$$;
CREATE TRIGGER lf_deploys AFTER INSERT OR UPDATE OR DELETE ON public.leaderfeed
  FOR EACH ROW EXECUTE FUNCTION lf_deploys_add();
`

// deployWrite is one row of the history.
type deployWrite struct {
	id        int64
	op        string // INSERT, UPDATE, DELETE or TOKEN
	key       string // the row's election column
	leader    string
	term      int64
	successor string
	handover  int64
	at        int64 // Monotonic: the trigger's clock_timestamp(), less deployRun.wallOffset
}

// node returns the node of a presence row.
func (w deployWrite) node() (string, bool) {
	_, node, ok := strings.Cut(w.key, "\x1f")
	return node, ok
}

func (w deployWrite) String() string {
	if node, ok := w.node(); ok {
		return fmt.Sprintf("#%d presence of %s: %s", w.id, node, w.op)
	}
	return fmt.Sprintf("#%d leader=%q term=%d successor=%q handover=%d", w.id, w.leader, w.term, w.successor, w.handover)
}

func (r *deployRun) lastWrite() (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), basetest.Scaled(10*time.Second))
	defer cancel()
	var id int64
	err := r.hist.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM lf_deploys`).Scan(&id)
	return id, err
}

func (r *deployRun) history() ([]deployWrite, error) {
	ctx, cancel := context.WithTimeout(context.Background(), basetest.Scaled(10*time.Second))
	defer cancel()
	rows, err := r.hist.Query(ctx, `SELECT id, op, key, leader, term, successor, handover, at FROM lf_deploys ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (deployWrite, error) {
		var w deployWrite
		var at time.Time
		err := row.Scan(&w.id, &w.op, &w.key, &w.leader, &w.term, &w.successor, &w.handover, &at)
		w.at = at.UnixNano() - r.wallOffset
		return w, err
	})
}

// startNode starts a node in slot and waits until it participates: its
// Start returned, which makes its first presence write, and its
// changefeed is up.
func (r *deployRun) startNode(slot int) (*proc, error) {
	h := r.h
	if err := h.start(slot); err != nil {
		return nil, err
	}
	h.mu.Lock()
	p := h.slots[slot]
	h.mu.Unlock()
	r.joined = append(r.joined, p)
	err := h.waitFor(p.name+" to participate with its changefeed up", h.cfg.bound, func() bool {
		return p.started && p.feedUp || p.end != 0
	})
	if err == nil && p.end != 0 {
		err = fmt.Errorf("%s ended as it started\n%s", p.name, h.state())
	}
	return p, err
}

// startGeneration starts deployNodes nodes of a new generation, one after
// another, each once the one before participates (so they joined in
// slot order), and waits until one of them leads.
func (r *deployRun) startGeneration() ([]*proc, error) {
	base := (r.gen % 2) * deployNodes
	var ps []*proc
	for k := range deployNodes {
		p, err := r.startNode(base + k)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, r.settle(ps)
}

// stop sends p SIGTERM, waits for its end and notes the last history
// row by then (r.ended).
func (r *deployRun) stop(p *proc) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(r.h.cfg.bound + 5*time.Second):
		return fmt.Errorf("%s still runs %v after SIGTERM\n%s", p.name, r.h.cfg.bound+5*time.Second, r.h.state())
	}
	mark, err := r.lastWrite()
	if err != nil {
		return err
	}
	r.ended[p.id] = mark
	return nil
}

// leaderIn returns the one process of ps that leads, if exactly one does
// and no other process does; h.mu is held.
func (r *deployRun) leaderIn(ps []*proc) *proc {
	var l *proc
	for _, p := range r.h.procs {
		if p.term == 0 {
			continue
		}
		if l != nil || !slices.Contains(ps, p) {
			return nil
		}
		l = p
	}
	return l
}

// settle waits until every process of ps runs with its changefeed up and
// exactly one of them, and no other process, leads.
func (r *deployRun) settle(ps []*proc) error {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.name
	}
	return r.h.waitFor("one leader among "+strings.Join(names, " "), r.h.cfg.bound+10*time.Second, func() bool {
		for _, p := range ps {
			if !p.started || !p.feedUp || p.end != 0 {
				return false
			}
		}
		return r.leaderIn(ps) != nil
	})
}

// end stops what still runs (each SIGTERM hands over, outside every
// window measured) and returns the end of the last window.
func (r *deployRun) end() (int64, int64) {
	at := Monotonic()
	mark, err := r.lastWrite()
	if err != nil {
		r.t.Error(err)
	}
	r.h.stopAll()
	r.load.close()
	return at, mark
}

// rollout is one rolling restart, as it was run.
type rollout struct {
	seq    int
	at     int64 // Monotonic, before the first new node started
	mark   int64 // the last history row before it
	leader string
	pos    int // of the leader among the old nodes, in the order they joined (1: oldest)
}

// rollout runs rollout seq on the old nodes and returns the new ones.
func (r *deployRun) rollout(seq int, old []*proc) (*rollout, []*proc, error) {
	h := r.h
	if err := r.settle(old); err != nil {
		return nil, nil, err
	}
	// Vary the phase of the rollout against the presence refreshes.
	time.Sleep(time.Duration(r.rng.Int64N(int64(r.presenceInterval))))
	mark, err := r.lastWrite()
	if err != nil {
		return nil, nil, err
	}
	h.mu.Lock()
	leader := r.leaderIn(old)
	h.mu.Unlock()
	if leader == nil { // it changed since settle: again
		return r.rollout(seq, old)
	}
	ro := &rollout{seq: seq, at: Monotonic(), mark: mark, leader: leader.name, pos: slices.Index(old, leader) + 1}
	r.gen++
	base := (r.gen % 2) * deployNodes
	var next []*proc
	for k, o := range old {
		p, err := r.startNode(base + k)
		if err != nil {
			return ro, nil, err
		}
		next = append(next, p)
		if err := r.stop(o); err != nil {
			return ro, nil, err
		}
	}
	return ro, next, nil
}

// move is one change of leader: the term that ended, the next one, and
// the gap between them.
type move struct {
	from, to Interval
	gap      time.Duration // negative: an overlap (Check reports it)
	bound    time.Duration // the gap's bound, stretched by the load
}

func (m move) String() string {
	return fmt.Sprintf("%s term %d (%s) -> %s term %d: gap %v (bound %v)", m.from.Proc, m.from.Term, m.from.Reason,
		m.to.Proc, m.to.Term, m.gap.Round(10*time.Microsecond), m.bound.Round(100*time.Microsecond))
}

// moves returns the changes of leader whose new term began in [from, to).
func (r *deployRun) moves(ivs []Interval, from, to int64) []move {
	var ms []move
	for i := 1; i < len(ivs); i++ {
		if ivs[i].Start < from || ivs[i].Start >= to {
			continue
		}
		m := move{from: ivs[i-1], to: ivs[i], gap: time.Duration(ivs[i].Start - ivs[i-1].End)}
		m.bound = r.gapBound(ivs[i-1].End)
		ms = append(ms, m)
	}
	return ms
}

// gapBound returns r.gap stretched by the load measured from a loadEvery
// before at to the end of the bound so stretched (and at least a
// loadEvery after at, so that the window holds a sample), as
// loadSampler.stretch does for a fault.
func (r *deployRun) gapBound(at int64) time.Duration {
	b := r.gap
	for range 2 {
		b = time.Duration(float64(r.gap) * r.load.slowdown(at-int64(loadEvery), at+int64(max(b, loadEvery))))
	}
	return b
}

// newTerms returns, per term won in the history rows (after, upTo], the
// rows from the last write of the term before to the new term's first,
// presence rows aside: one row (the handover) when the record named the
// successor at once.
func newTerms(hist []deployWrite, after, upTo int64) (terms []int64, writes map[int64][]deployWrite) {
	writes = map[int64][]deployWrite{}
	var top int64
	var pending []deployWrite
	for _, w := range hist {
		if _, ok := w.node(); ok || w.id > upTo {
			continue
		}
		if w.id <= after {
			top = max(top, w.term)
			continue
		}
		switch {
		case w.leader != "" && w.term > top:
			top = w.term
			terms = append(terms, w.term)
			writes[w.term] = append(pending, w)
			pending = nil
		case w.leader != "" && w.term == top:
			pending = nil // a renewal
		default:
			pending = append(pending, w) // a vacancy
		}
	}
	return terms, writes
}

// checkRollouts checks the logs and the history of a rollout test and
// logs what was measured.
func (r *deployRun) checkRollouts(rolls []*rollout, endAt, endMark int64) {
	t := r.t
	j := r.judge(endMark)
	rep, hist, fail := j.rep, j.hist, j.fail
	var lines []string
	movesHist := map[int]int{} // moves by the rollout (starved ones aside) -> rollouts
	starved, oneWrite, twoWrites, untokened := 0, 0, 0, 0
	for i, ro := range rolls {
		to, upTo := endAt, endMark
		if i+1 < len(rolls) {
			to, upTo = rolls[i+1].at, rolls[i+1].mark
		}
		ms := r.moves(rep.Intervals, ro.at, to)
		terms, writes := newTerms(hist, ro.mark, upTo)
		var longest time.Duration
		n := 0
		var desc []string
		for _, m := range ms {
			if m.from.Reason == "lease-expired" {
				starved++
			} else {
				n++
			}
			longest = max(longest, m.gap)
			ws := writes[int64(m.to.Term)]
			switch len(ws) {
			case 1:
				oneWrite++
			case 2:
				twoWrites++
			}
			d := fmt.Sprintf("%v, %d write(s)%s", m, len(ws), j.gap(m, ws))
			if len(ws) > 0 {
				// The old leader read the participants after its
				// withdrawal: a token written after that may be unseen.
				ref := ws[0].id
				if del := withdrawal(hist, m.from.Proc); del != nil {
					ref = min(ref, del.id)
				}
				if n := newestWithoutToken(hist, ref); n != "" {
					untokened++
					d += ", the participant that joined last (" + n + ") had no token yet"
				}
			}
			switch {
			case m.gap > gapCap():
				fail("rollout %d: %s: the gap is longer than %v: the handover waited for a lease or an election timeout", ro.seq, d, gapCap())
			case m.gap > m.bound:
				j.overBound++
				d += " (over the idle-machine bound: counted, not failed)"
			}
			desc = append(desc, d)
		}
		movesHist[n]++
		if n != 1 {
			fail("rollout %d (leader %s, %d. oldest): leadership moved %d times, want once:\n  %s\n  the store's history in the rollout but renewals:%s",
				ro.seq, ro.leader, ro.pos, n, strings.Join(desc, "\n  "), notRenewals(hist, ro.mark, upTo))
		}
		if len(terms) != len(ms) {
			fail("rollout %d: the nodes' logs begin %d terms, the store's history %d (%v)", ro.seq, len(ms), len(terms), terms)
		}
		lines = append(lines, fmt.Sprintf("rollout %d: leader %s (%d. oldest), %d move(s), longest gap %v; %s",
			ro.seq, ro.leader, ro.pos, len(ms), longest.Round(10*time.Microsecond), strings.Join(desc, "; ")))
	}
	t.Logf("%s: %d rollouts of %d nodes, load %s at the end\n  %s, writes naming a node that had left %d\n  moves per rollout %s (plus %d after a lease lost to starvation); handovers in one write %d, in two (vacancy, claim) %d; made while the participant that joined last had no token yet %d; %s\n  %s",
		r.h.cfg.label, len(rolls), deployNodes, loadavg(), rep.Counts(), j.gone, counts(movesHist), starved, oneWrite, twoWrites, untokened,
		j.gapsLine(), strings.Join(lines, "\n  "))
	j.report("")
}

// pctMicro is pct to the 10 µs.
func pctMicro(ds []time.Duration, q float64) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(max(int(q*float64(len(s))+0.999999)-1, 0), len(s)-1)
	return s[i].Round(10 * time.Microsecond).String()
}

// shrink is one shrink from deployNodes nodes to one.
type shrink struct {
	seq   int
	at    int64 // Monotonic, before the first stop
	mark  int64 // the last history row before it
	stops []shrinkStop
	end   int64 // Monotonic, before the last node's stop
}

// shrinkStop is one stop of a shrink.
type shrinkStop struct {
	victim string
	leader bool  // it led when it was stopped
	at     int64 // Monotonic, before SIGTERM
	ended  int64 // the last history row once it had ended
}

// shrink starts deployNodes fresh nodes and stops all but one.
func (r *deployRun) shrink(seq int) (*shrink, error) {
	h := r.h
	r.gen++
	live, err := r.startGeneration()
	if err != nil {
		return nil, err
	}
	mark, err := r.lastWrite()
	if err != nil {
		return nil, err
	}
	s := &shrink{seq: seq, at: Monotonic(), mark: mark}
	for k := range deployNodes - 1 {
		if err := r.settle(live); err != nil {
			return s, err
		}
		h.mu.Lock()
		leader := r.leaderIn(live)
		h.mu.Unlock()
		if leader == nil {
			return s, fmt.Errorf("no single leader among %d nodes", len(live))
		}
		victim := leader
		if k%2 == 0 {
			// The node the leader would hand over to.
			var others []*proc
			for _, p := range live {
				if p != leader {
					others = append(others, p)
				}
			}
			if seq%2 == 1 {
				victim = others[len(others)-1] // joined last
			} else {
				victim = slices.MinFunc(others, func(a, b *proc) int { return strings.Compare(a.id, b.id) })
			}
		}
		st := shrinkStop{victim: victim.name, leader: victim == leader, at: Monotonic()}
		if err := r.stop(victim); err != nil {
			return s, err
		}
		if st.ended, err = r.lastWrite(); err != nil {
			return s, err
		}
		s.stops = append(s.stops, st)
		live = slices.DeleteFunc(live, func(p *proc) bool { return p == victim })
	}
	if err := r.settle(live); err != nil {
		return s, err
	}
	// The last node: SIGTERM with nobody to hand over to (a vacancy), so
	// that the next shrink's nodes start on an open election.
	s.end = Monotonic()
	return s, r.stop(live[0])
}

// checkShrinks checks the logs and the history of a shrink test and logs
// what was measured.
func (r *deployRun) checkShrinks(shrinks []*shrink, endAt, endMark int64) {
	t := r.t
	j := r.judge(endMark)
	rep, hist, fail := j.rep, j.hist, j.fail
	var lines []string

	// Each leader's stop: one write to the next leader, a gap within its
	// bound.
	handovers, oneWrite := 0, 0
	for i, s := range shrinks {
		upTo := endMark
		if i+1 < len(shrinks) {
			upTo = shrinks[i+1].mark
		}
		to := cmp.Or(s.end, endAt)
		_, writes := newTerms(hist, s.mark, upTo)
		var desc []string
		for k, st := range s.stops {
			if !st.leader {
				desc = append(desc, "stop "+st.victim)
				continue
			}
			handovers++
			next := to
			if k+1 < len(s.stops) {
				next = s.stops[k+1].at
			}
			ms := r.moves(rep.Intervals, st.at, next)
			if len(ms) == 0 {
				fail("shrink %d: no leader after the stop of the leader %s", s.seq, st.victim)
				continue
			}
			m := ms[0]
			w := len(writes[int64(m.to.Term)])
			if w == 1 {
				oneWrite++
			}
			parts := j.gap(m, writes[int64(m.to.Term)])
			switch {
			case m.from.Proc != st.victim:
				fail("shrink %d: the stop of the leader %s: the first move is %v", s.seq, st.victim, m)
			case m.gap > gapCap():
				fail("shrink %d: the stop of the leader %s: %v%s: longer than %v: the handover waited for a lease or an election timeout", s.seq, st.victim, m, parts, gapCap())
			case w != 1:
				fail("shrink %d: the stop of the leader %s: %v: the next term came after %d writes, want 1 (the handover)", s.seq, st.victim, m, w)
			case m.gap > m.bound:
				j.overBound++
				t.Logf("shrink %d: the stop of the leader %s: %v%s: over the idle-machine bound: counted, not failed", s.seq, st.victim, m, parts)
			}
			if len(ms) > 1 {
				fail("shrink %d: the stop of the leader %s moved leadership %d times: %v", s.seq, st.victim, len(ms), ms)
			}
			desc = append(desc, fmt.Sprintf("stop the leader: %v, %d write(s)", m, w))
		}
		rule := "joined last"
		if s.seq%2 == 0 {
			rule = "lowest id"
		}
		lines = append(lines, fmt.Sprintf("shrink %d (successor stopped first: %s): %s", s.seq, rule, strings.Join(desc, "; ")))
	}
	t.Logf("%s: %d shrinks of %d nodes to 1, load %s at the end\n  %s\n  writes naming a node that had left %d; leader stops %d, handed over in one write %d; %s\n  %s",
		r.h.cfg.label, len(shrinks), deployNodes, loadavg(), rep.Counts(), j.gone, handovers, oneWrite,
		j.gapsLine(), strings.Join(lines, "\n  "))
	j.report("\n  the store's history but renewals:" + notRenewals(hist, 0, endMark))
}

// deployJudge gathers what the checks of a deploy test find: its
// problems, and the gaps of its moves and their parts.
type deployJudge struct {
	r        *deployRun
	logs     []NodeLog
	rep      *Report
	hist     []deployWrite
	problems []string
	gone     int // writes naming a node that had left (namedGone)
	// gaps, and their parts (gapParts) where the history has them.
	gaps, withdrawals, writesAt []time.Duration
	overBound                   int // gaps over the idle-machine bound (logged)
}

// judge collects the nodes' logs and the store's history and checks what
// every deploy test checks: the logs (Check) and namedGone up to endMark.
func (r *deployRun) judge(endMark int64) *deployJudge {
	logs, _ := r.h.collect()
	j := &deployJudge{r: r, logs: logs, rep: Check(logs, nil, r.h.cfg.bound)}
	var err error
	if j.hist, err = r.history(); err != nil {
		r.t.Fatal(err)
	}
	if err := j.rep.Err(); err != nil {
		j.fail("%v", err)
	}
	gone := namedGone(j.hist, r.ended, endMark)
	j.gone = len(gone)
	for _, g := range gone {
		j.fail("%s", g)
	}
	return j
}

func (j *deployJudge) fail(format string, args ...any) {
	j.problems = append(j.problems, fmt.Sprintf(format, args...))
}

// gap counts the gap of m, whose new term the writes ws began, and
// returns its parts for a description: "" when the history lacks them.
func (j *deployJudge) gap(m move, ws []deployWrite) string {
	j.gaps = append(j.gaps, m.gap)
	wd, wr, el, ok := gapParts(j.hist, m, ws)
	if !ok {
		return ""
	}
	j.withdrawals, j.writesAt = append(j.withdrawals, wd), append(j.writesAt, wr)
	return fmt.Sprintf(" (withdrawn +%v, written +%v, elected +%v)", wd.Round(10*time.Microsecond), wr.Round(10*time.Microsecond), el.Round(10*time.Microsecond))
}

// gapsLine formats the gaps and their parts as p50 and max.
func (j *deployJudge) gapsLine() string {
	return fmt.Sprintf("gap p50 %s, max %s (%d over the idle-machine bound of %v times the load, counted, not failed); "+
		"from the end of the old term to its withdrawal p50 %s, max %s; to the write of the next term p50 %s, max %s",
		pctMicro(j.gaps, 0.5), pctMicro(j.gaps, 1), j.overBound, j.r.gap,
		pctMicro(j.withdrawals, 0.5), pctMicro(j.withdrawals, 1), pctMicro(j.writesAt, 0.5), pctMicro(j.writesAt, 1))
}

// report fails the test with the problems found, then more, keeping the
// nodes' logs.
func (j *deployJudge) report(more string) {
	if len(j.problems) > 0 {
		j.r.h.keepLogs(j.logs, nil)
		j.r.t.Error(strings.Join(j.problems, "\n") + more)
	}
}

// namedGone describes every write that names a node that had left as the
// leader of a new term (a claim or a handover) or as the successor of a
// vacancy: a node whose presence was withdrawn before the write, or whose
// process had been seen to end (ended: the last row by then) before it;
// every node that the record still named (as leader or successor) when
// its process had been seen to end: one handed the election that did not
// take it before it stopped, and left the others waiting for their
// election timeout; and every presence record written again after its
// node withdrew it.
// The stops of the tests never overlap (each waits for the end of the
// one before), so no such write can be in flight across a withdrawal;
// the rows after upTo, the end of the test's stopping every node at once,
// are not checked. A leader's own renewals are not checked either: one in
// flight as it stops is its own write, not a handover.
func namedGone(hist []deployWrite, ended map[string]int64, upTo int64) []string {
	var out []string
	gone := map[int64][]string{} // the last row by the end of these nodes
	for n, at := range ended {
		gone[at] = append(gone[at], n)
	}
	withdrawn := map[string]int64{}
	var top int64
	var record deployWrite // the election record's last write so far
	for _, w := range hist {
		if w.id > upTo {
			break
		}
		if node, ok := w.node(); ok {
			switch at, left := withdrawn[node]; {
			case w.op == "DELETE":
				withdrawn[node] = w.id
			case left && w.op == "INSERT":
				// A write of the node's that was in flight when it
				// withdrew: the store lists it as a participant again,
				// newly joined, until its record expires.
				out = append(out, fmt.Sprintf("the presence of %s was written again (#%d) after its withdrawal (#%d)", node, w.id, at))
			}
		} else {
			var named []string
			if w.leader != "" && w.term > top {
				named = append(named, w.leader)
			}
			if w.successor != "" {
				named = append(named, w.successor)
			}
			top, record = max(top, w.term), w
			for _, n := range named {
				if at, ok := withdrawn[n]; ok {
					out = append(out, fmt.Sprintf("write %v names %s, whose presence was withdrawn at #%d", w, n, at))
				} else if at, ok := ended[n]; ok && w.id > at {
					out = append(out, fmt.Sprintf("write %v names %s, whose process had ended by #%d", w, n, at))
				}
			}
		}
		for _, n := range gone[w.id] {
			if record.leader == n || record.successor == n {
				out = append(out, fmt.Sprintf("the record still named %s when its process had ended (by #%d): %v", n, w.id, record))
			}
		}
	}
	return out
}

// notRenewals formats the history rows (after, upTo] but the renewals
// (writes of the term before by its leader, without a handover token).
func notRenewals(hist []deployWrite, after, upTo int64) string {
	var b strings.Builder
	var top int64
	leader := ""
	for _, w := range hist {
		if w.id > upTo {
			break
		}
		_, presence := w.node()
		renewal := !presence && w.leader != "" && w.leader == leader && w.term == top && w.handover == 0
		if !presence {
			top, leader = max(top, w.term), w.leader
		}
		if w.id > after && !renewal {
			b.WriteString("\n    " + w.String())
		}
	}
	return b.String()
}

// newestWithoutToken returns the participant that joined last among those
// present before history row id, if it had written no token by then (a
// leader that read the participants then skips it), else "".
func newestWithoutToken(hist []deployWrite, id int64) string {
	present, tokened := map[string]bool{}, map[string]bool{}
	var order []string
	for _, w := range hist {
		if w.id >= id {
			break
		}
		node, ok := w.node()
		if !ok {
			continue
		}
		switch w.op {
		case "INSERT":
			present[node] = true
			order = append(order, node)
		case "DELETE":
			delete(present, node)
		case "TOKEN":
			tokened[node] = true
		}
	}
	for i := len(order) - 1; i >= 0; i-- {
		if n := order[i]; present[n] {
			if tokened[n] {
				return ""
			}
			return n
		}
	}
	return ""
}

// gapParts splits the gap of m, whose new term's writes (newTerms) are ws,
// on the one time line: from the old leader's end of term to its presence
// record's withdrawal (the trigger's time of the delete), to the write
// that gave the next term, to the new leader's start. ok is false when
// either write is not in the history.
func gapParts(hist []deployWrite, m move, ws []deployWrite) (withdrawn, written, elected time.Duration, ok bool) {
	if len(ws) == 0 {
		return 0, 0, 0, false
	}
	del := withdrawal(hist, m.from.Proc)
	if del == nil {
		return 0, 0, 0, false
	}
	end := m.from.End
	return time.Duration(del.at - end), time.Duration(ws[len(ws)-1].at - end), time.Duration(m.to.Start - end), true
}

// withdrawal returns the history row of the withdrawal of the process
// named proc ("g03-n2#2"), or nil.
func withdrawal(hist []deployWrite, proc string) *deployWrite {
	node, _, _ := strings.Cut(proc, "#")
	for i := range hist {
		w := &hist[i]
		if n, isPresence := w.node(); isPresence && n == node && w.op == "DELETE" {
			return w
		}
	}
	return nil
}
