package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The comparison with what a PostgreSQL user would write instead of
// leaderfeed (issue 18): the three electors as node processes on the same
// server, clean handover, crash (kill -9), a silent cut of the leader,
// steady-state cost, and the floor of a handover in bare pgx.

// selfExe is this program, re-executed as "bench node".
var selfExe string

// cutSample is one silent cut of a leader.
type cutSample struct {
	believed time.Duration // from the cut until the cut leader stopped believing it leads; -1: not by the end of the wait
	toLeader time.Duration // from the cut until another node led; -1: nobody within the wait
	overlap  time.Duration // both believed they led
}

// cmpResult is what the comparison measured for one elector kind.
type cmpResult struct {
	kind     string
	label    string // kind, or kind and what differs
	cutOnly  bool   // a variant measured only in the cut
	cfg      config
	handover series
	crash    series
	cut      []cutSample
	cutLost  losses                  // cut rounds without a leader to cut, retried
	checks   map[string]overlapStats // per scenario, from the checker
	errs     []string
}

// costRow is the steady-state cost of one kind with some elections.
type costRow struct {
	kind          string
	elections     int
	seconds       float64
	serverStmts   float64 // statements per second, all nodes (pg_stat_statements or commits)
	walBytes      float64 // WAL bytes per second
	leaderStmts   float64 // statements per second sent by the leader (1 election)
	followerStmts float64 // by the busiest follower (1 election)
	clientStmts   float64 // by all nodes
	changes       int     // elections whose leader changed during the window
	err           error
}

type compareReport struct {
	results    []*cmpResult
	cost       []costRow
	costSource string // what serverStmts counts
	floor      floorResult
	floorErr   error
}

func (r *cmpResult) fail(scenario string, err error) {
	logf("  %s %s: FAILED: %v", scenario, r.label, err)
	r.errs = append(r.errs, fmt.Sprintf("%s: %v", scenario, err))
}

func (r *cmpResult) check(scenario string, c *cluster) {
	st := c.overlaps()
	r.checks[scenario] = st
	if st.count > 0 {
		logf("  checker: %s %s: %d overlaps in %d leadership intervals, longest %s ms", scenario, r.label, st.count, st.intervals, ms(summarize(st.durations).max))
	}
}

func runCompare(ctx context.Context, cfg config, shared *pgxpool.Pool) (*compareReport, error) {
	if err := createLeaseTable(ctx, shared); err != nil {
		return nil, err
	}
	rep := &compareReport{}
	for _, k := range electorKinds {
		rep.results = append(rep.results, &cmpResult{kind: k, label: k, cfg: cfg, checks: map[string]overlapStats{},
			handover: series{scenario: "cmp-handover", system: k}, crash: series{scenario: "cmp-crash", system: k}})
	}
	if cfg.shortKeepalive > 0 {
		v := cfg
		v.serverKeepalive = cfg.shortKeepalive
		rep.results = append(rep.results, &cmpResult{kind: kindAdvisory, label: fmt.Sprintf("%s, server keepalive %v", kindAdvisory, cfg.shortKeepalive),
			cutOnly: true, cfg: v, checks: map[string]overlapStats{}})
	}

	logf("comparison: handover across processes (%d samples each, one kind after the other)", cfg.cmpSamples)
	for _, r := range rep.results {
		if r.cutOnly {
			continue
		}
		if err := cmpHandover(ctx, cfg, r); err != nil {
			r.fail("handover", err)
		}
		logSeries(r.handover)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	logf("comparison: floors in bare pgx, one write and two writes, alone and with the scenarios' listeners (%d samples each)", cfg.samples)
	rep.floor, rep.floorErr = measureFloor(ctx, cfg, shared)

	logf("comparison: crash (kill -9, %d samples) and silent cut (%d samples, wait %v, server keepalive %v), kinds side by side",
		cfg.cmpCrash, cfg.cmpCut, cfg.cutWait, cfg.serverKeepalive)
	var wg sync.WaitGroup
	for _, r := range rep.results {
		wg.Go(func() {
			if !r.cutOnly {
				if err := cmpCrash(ctx, cfg, r); err != nil {
					r.fail("crash", err)
				}
				logSeries(r.crash)
			}
			if err := cmpCut(ctx, r.cfg, r); err != nil {
				r.fail("cut", err)
			}
			logCut(r)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	rep.costSource = costSource(ctx, shared)
	logf("comparison: steady-state cost over %v, elections %v (%s)", cfg.costWindow, cfg.costElections, rep.costSource)
	for _, n := range cfg.costElections {
		for _, k := range electorKinds {
			row := measureCost(ctx, cfg, shared, k, n, rep.costSource)
			if row.err != nil {
				logf("  cost %s ×%d: FAILED: %v", k, n, row.err)
			} else {
				logf("  cost %s ×%d: %.1f statements/s (server), %.0f WAL bytes/s; clients %.1f statements/s (leader %.1f, busiest follower %.1f)",
					k, n, row.serverStmts, row.walBytes, row.clientStmts, row.leaderStmts, row.followerStmts)
			}
			rep.cost = append(rep.cost, row)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
	}
	return rep, nil
}

func logSeries(s series) {
	if len(s.samples) == 0 {
		return
	}
	sum := summarize(s.samples)
	logf("  %s %s: n=%d p50=%s p99=%s max=%s ms", s.scenario, s.system, sum.n, ms(sum.p50), ms(sum.p99), ms(sum.max))
}

func logCut(r *cmpResult) {
	var ov int
	for _, s := range r.cut {
		if s.overlap > 0 {
			ov++
		}
	}
	logf("  cut %s: %d samples, %d with two leaders", r.label, len(r.cut), ov)
}

// createLeaseTable creates the polling lease elector's table.
func createLeaseTable(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_lease (name text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL)`); err != nil {
		return fmt.Errorf("postgres: create bench_lease: %w", err)
	}
	return nil
}

// cmpHandover: after a pause, the leader is told to resign; the sample is from when it
// began to (its own stamp) until another node believes it leads. A round
// in which the leadership changed before the resign, or no other node led
// within -slack bounds, is counted and retried.
func cmpHandover(ctx context.Context, cfg config, r *cmpResult) error {
	var extra []string
	if r.kind == kindLeaderfeed && !cfg.noPresence {
		extra = []string{"-participate"}
	}
	c, err := newCluster(ctx, cfg, r.kind, "cmphand", 1, false, extra...)
	if err != nil {
		return err
	}
	defer func() {
		c.close()
		r.check("handover", c)
	}()
	wait := cfg.within(cfg.bound())
	for len(r.handover.samples) < cfg.cmpSamples {
		if err := r.handover.tooManyLost(cfg.cmpSamples); err != nil {
			return err
		}
		leader, err := c.waitLeader(ctx, 0, wait)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.handover.lose(fmt.Sprintf("no leader within %v", wait))
			continue
		}
		// A random part of the pause lets the resign fall at any phase of
		// the others' retry or poll timers (a fixed pause would lock it to
		// one phase).
		if err := sleep(ctx, cfg.settle+rand.N(cfg.bound())); err != nil {
			return err
		}
		c.drain()
		if c.leaderOf(0) != leader {
			r.handover.lose("leadership changed before the resign")
			continue
		}
		if err := c.send(leader, "resign 0"); err != nil {
			return err
		}
		deadline := monotonic() + int64(wait)
		// The events of different processes come through pipes of their
		// own, so the next leader's may come in before the resigning
		// leader's: the sample needs both, in either order.
		var t0, t1 int64
		_, err = c.next(ctx, deadline, func(ev nodeEvent) bool {
			switch {
			case ev.kind == 'S' && ev.p == leader && t0 == 0:
				t0 = ev.mono
			case ev.kind == 'E' && ev.p != leader && t1 == 0:
				t1 = ev.mono
			}
			return t0 != 0 && t1 != 0
		})
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			r.handover.lose(fmt.Sprintf("no other node led within %v of the resign", wait))
		default:
			r.handover.samples = append(r.handover.samples, time.Duration(t1-t0))
		}
	}
	return nil
}

// cmpCrash: after a random pause, kill -9 the leader's process; the sample
// is from just before the kill until another node believes it leads. The
// dead node is replaced by a new process. A round in which the leadership
// changed in the pause, or no other node led within the wait, is counted
// and retried.
func cmpCrash(ctx context.Context, cfg config, r *cmpResult) error {
	c, err := newCluster(ctx, cfg, r.kind, "cmpcrash", 1, true)
	if err != nil {
		return err
	}
	defer func() {
		c.close()
		r.check("crash", c)
	}()
	// Each elector promises a new leader within the bound (its retry or
	// poll period, or election timeout, after the holder's session or
	// heartbeats end).
	limit := cfg.within(cfg.bound())
	for len(r.crash.samples) < cfg.cmpCrash {
		if err := r.crash.tooManyLost(cfg.cmpCrash); err != nil {
			return err
		}
		leader, err := c.waitLeader(ctx, 0, limit)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.crash.lose(fmt.Sprintf("no leader within %v", limit))
			continue
		}
		if err := sleep(ctx, crashPause()); err != nil {
			return err
		}
		c.drain()
		if c.leaderOf(0) != leader {
			r.crash.lose("leadership changed before the crash")
			continue
		}
		t0 := monotonic()
		c.kill(leader)
		ev, err := c.next(ctx, t0+int64(limit), func(ev nodeEvent) bool { return ev.kind == 'E' && ev.p != leader })
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			r.crash.lose(fmt.Sprintf("no other node led within %v of the kill", limit))
		default:
			r.crash.samples = append(r.crash.samples, time.Duration(ev.mono-t0))
		}
		if err := c.start(ctx, leader.slot); err != nil {
			return err
		}
	}
	return nil
}

// cmpCut: after a random pause, the leader's proxy stops forwarding. The
// sample waits (at most -cut-wait) until the cut leader stops believing it
// leads and another node leads. Then the cut node is killed, its
// connections reset, and a new process takes its place.
func cmpCut(ctx context.Context, cfg config, r *cmpResult) error {
	c, err := newCluster(ctx, cfg, r.kind, "cmpcut", 1, true)
	if err != nil {
		return err
	}
	defer func() {
		c.close()
		r.check("cut", c)
	}()
	wait := cfg.within(cfg.bound())
	for len(r.cut) < cfg.cmpCut {
		if err := r.cutLost.tooMany(cfg.cmpCut); err != nil {
			return err
		}
		leader, err := c.waitLeader(ctx, 0, wait)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.cutLost.lose("cut "+r.label, fmt.Sprintf("no leader within %v", wait))
			continue
		}
		if err := sleep(ctx, crashPause()); err != nil {
			return err
		}
		c.drain()
		t0 := monotonic()
		c.proxies[leader.slot].blackhole()
		s := cutSample{believed: -1, toLeader: -1}
		var newAt, endAt int64
		_, err = c.next(ctx, t0+int64(cfg.cutWait), func(ev nodeEvent) bool {
			switch {
			case ev.kind == 'U' && ev.p == leader && endAt == 0:
				endAt = ev.mono
			case ev.kind == 'E' && ev.p != leader && newAt == 0:
				newAt = ev.mono
			}
			return endAt != 0 && newAt != 0
		})
		if err != nil && !errors.Is(err, errNoEvent) {
			return err
		}
		// The cut leader's report that it stopped may still be on its way
		// (leaderfeed stamps the end of its lease, and a loaded machine
		// delays the event): give it a moment before the kill ends it.
		for i := 0; endAt == 0 && i < 200; i++ {
			if b := c.beliefOf(leader.name, 0, t0); b.end != 0 {
				break
			}
			if err := sleep(ctx, 10*time.Millisecond); err != nil {
				return err
			}
		}
		c.kill(leader)
		b := c.beliefOf(leader.name, 0, t0)
		switch {
		case b.start == 0: // it had lost leadership just before the cut
			b.end = t0
			s.believed = 0
		case b.reason != "killed":
			s.believed = time.Duration(b.end - t0)
		}
		if newAt != 0 {
			s.toLeader = time.Duration(newAt - t0)
			s.overlap = time.Duration(max(0, b.end-newAt))
		}
		r.cut = append(r.cut, s)
		c.proxies[leader.slot].reset()
		if err := c.start(ctx, leader.slot); err != nil {
			return err
		}
	}
	return nil
}

// costSource says how server-side statements are counted: with
// pg_stat_statements if the server has it loaded, else by committed
// transactions (every elector statement runs in a transaction of its own).
func costSource(ctx context.Context, pool *pgxpool.Pool) string {
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err == nil {
		var n int64
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n); err == nil {
			return "pg_stat_statements"
		}
	}
	return "pg_stat_database.xact_commit"
}

type serverStats struct {
	stmts int64
	lsn   string
}

func readServerStats(ctx context.Context, pool *pgxpool.Pool, source string) (serverStats, error) {
	var s serverStats
	q := `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal%'`
	if source != "pg_stat_statements" {
		q = `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`
	}
	if err := pool.QueryRow(ctx, q).Scan(&s.stmts); err != nil {
		return s, err
	}
	err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s.lsn)
	return s, err
}

func walDiff(ctx context.Context, pool *pgxpool.Pool, a, b string) (float64, error) {
	var d float64
	err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8", b, a).Scan(&d)
	return d, err
}

func (c *cluster) counts(ctx context.Context) ([]int64, error) {
	out := make([]int64, len(c.procs))
	for i, p := range c.procs {
		if err := c.send(p, "count"); err != nil {
			return nil, err
		}
		select {
		case out[i] = <-p.counts:
		case <-time.After(5 * time.Second):
			return nil, fmt.Errorf("%s: no count", p.name)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// measureCost: three nodes of one kind in n elections, left alone for
// -cost-window once every election has a leader (and a settling pause).
func measureCost(ctx context.Context, cfg config, pool *pgxpool.Pool, kind string, n int, source string) (row costRow) {
	row = costRow{kind: kind, elections: n}
	c, err := newCluster(ctx, cfg, kind, "cost", n, true)
	if err != nil {
		row.err = err
		return row
	}
	defer c.close()
	for i := range n {
		if _, err := c.waitLeader(ctx, i, 30*time.Second); err != nil {
			row.err = err
			return row
		}
	}
	if row.err = sleep(ctx, 2*cfg.bound()); row.err != nil {
		return row
	}
	leaders := func() []string {
		out := make([]string, n)
		for i := range n {
			if p := c.leaderOf(i); p != nil {
				out[i] = p.name
			}
		}
		return out
	}
	l0 := leaders()
	s0, err := readServerStats(ctx, pool, source)
	if err != nil {
		row.err = err
		return row
	}
	c0, err := c.counts(ctx)
	if err != nil {
		row.err = err
		return row
	}
	t0 := time.Now()
	if row.err = sleep(ctx, cfg.costWindow); row.err != nil {
		return row
	}
	c1, err := c.counts(ctx)
	if err != nil {
		row.err = err
		return row
	}
	s1, err := readServerStats(ctx, pool, source)
	if err != nil {
		row.err = err
		return row
	}
	secs := time.Since(t0).Seconds()
	l1 := leaders()
	leading := map[string]bool{}
	for i := range n {
		leading[l0[i]] = true
		if l0[i] != l1[i] {
			row.changes++
		}
	}
	wal, err := walDiff(ctx, pool, s0.lsn, s1.lsn)
	if err != nil {
		row.err = err
		return row
	}
	row.seconds = secs
	row.serverStmts = float64(s1.stmts-s0.stmts) / secs
	row.walBytes = wal / secs
	for i, p := range c.procs {
		v := float64(c1[i]-c0[i]) / secs
		row.clientStmts += v
		if leading[p.name] {
			row.leaderStmts += v
		} else {
			row.followerStmts = max(row.followerStmts, v)
		}
	}
	return row
}

// floorResult is the bare-pgx handover, in its two shapes.
//
// The two-write floor (a handover through a vacancy, what leaderfeed does
// without participants): connection A writes the vacancy and notifies in
// one statement, connection B (listening) receives the notification and
// writes its claim; total is until B has its claim's reply. crowded is
// the same with floorCrowd more connections listening.
//
// The one-write floor (what a participant's handover is): A writes the
// record that names B, with a compare-and-set on its revision, and
// notifies in the same statement; the sample is until B's listening
// connection has the notification. one holds it with 0, nodeCrowd and
// floorCrowd more connections listening: PostgreSQL wakes every listening
// backend of the database on a commit that notifies, so each handover
// scenario is compared with the floor that has its listeners.
type floorResult struct {
	total, vacancy, notified, crowded series
	one                               []oneFloor
	across                            oneFloor // the node processes' floor: see floorAcross
	acrossErr                         error
}

// oneFloor is the one-write floor with others more listening connections.
type oneFloor struct {
	others  int
	pause   string          // between samples, as the scenario compared with it
	samples []time.Duration // A's statement until B has the notification
	write   []time.Duration // A's statement until its reply
}

// oneWrite returns the one-write floor with others more listeners.
func (f floorResult) oneWrite(others int) []time.Duration {
	for _, o := range f.one {
		if o.others == others {
			return o.samples
		}
	}
	return nil
}

// nodeFloor is the floor the node processes' handover is compared with:
// the one laid out as they are (floorAcross), or, if it failed, the one in
// this process with their listeners.
func (f floorResult) nodeFloor() []time.Duration {
	if len(f.across.samples) > 0 {
		return f.across.samples
	}
	return f.oneWrite(nodeCrowd)
}

// The listening connections of the handover scenarios besides the
// successor's: in one process the other two candidates' and the
// observer's (floorCrowd); across node processes the other two nodes'
// (nodeCrowd).
const (
	floorCrowd = 3
	nodeCrowd  = 2
)

// floorHandOver is the one-write floor's statement: the compare-and-set
// naming the successor ($3), with its notification on channel $4.
const floorHandOver = `WITH u AS (UPDATE bench_floor SET leader = $3, rev = rev + 1 WHERE name = $1 AND rev = $2 RETURNING rev)
		SELECT pg_notify($4, rev::text) FROM u`

func measureFloor(ctx context.Context, cfg config, pool *pgxpool.Pool) (floorResult, error) {
	res := floorResult{total: series{scenario: "floor", system: "bare pgx"}}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_floor (name text PRIMARY KEY, leader text NOT NULL, rev bigint NOT NULL)`); err != nil {
		return res, err
	}
	name := electionName("floor")
	if _, err := pool.Exec(ctx, `INSERT INTO bench_floor VALUES ($1, 'a', 1)`, name); err != nil {
		return res, err
	}
	a, err := pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer b.Release()
	channel := strings.ReplaceAll(name, "-", "_")
	if _, err := b.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return res, err
	}
	defer func() { _, _ = b.Exec(context.Background(), "UNLISTEN *") }()
	const vacate = `WITH u AS (UPDATE bench_floor SET leader = '', rev = rev + 1 WHERE name = $1 RETURNING rev)
		SELECT pg_notify($2, rev::text) FROM u`
	const claim = `UPDATE bench_floor SET leader = 'b', rev = rev + 1 WHERE name = $1 AND rev = $2 RETURNING rev`
	notified := func() (int64, error) {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		note, err := b.Conn().WaitForNotification(wctx)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("floor: notification: %w", err)
		}
		rev, err := strconv.ParseInt(note.Payload, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("floor: payload %q: %w", note.Payload, err)
		}
		return rev, nil
	}
	pause := func() error { return sleep(ctx, 10*time.Millisecond+rand.N(10*time.Millisecond)) }
	// The two-write floor, alone and with the one process's listeners.
	var rev int64
	for _, others := range []int{0, floorCrowd} {
		stop, err := crowd(ctx, pool.Config().ConnConfig, channel, others)
		if err != nil {
			return res, err
		}
		for range cfg.samples {
			if err := pause(); err != nil {
				stop()
				return res, err
			}
			t0 := time.Now()
			if _, err := a.Exec(ctx, vacate, name, channel); err != nil {
				stop()
				return res, err
			}
			t1 := time.Now()
			if rev, err = notified(); err != nil {
				stop()
				return res, err
			}
			t2 := time.Now()
			if err := b.QueryRow(ctx, claim, name, rev).Scan(&rev); err != nil {
				stop()
				return res, fmt.Errorf("floor: claim: %w", err)
			}
			t3 := time.Now()
			if others > 0 {
				res.crowded.samples = append(res.crowded.samples, t3.Sub(t0))
				continue
			}
			res.total.samples = append(res.total.samples, t3.Sub(t0))
			res.vacancy.samples = append(res.vacancy.samples, t1.Sub(t0))
			res.notified.samples = append(res.notified.samples, t2.Sub(t0))
		}
		stop()
	}
	// The one-write floor: the handover write names the other node, as
	// leaderfeed's does, alternately b and a (the record's name changes
	// each time; only B listens). With the listeners of a handover
	// scenario, it pauses between samples as that scenario pauses between
	// handovers: after 150 ms idle a machine's caches are cold and its
	// cores asleep, and a write and its notification take longer than
	// back to back (on the 2-core VM of the docs, 0.85 ms against 0.50).
	for _, c := range []struct {
		others int
		pause  func() error
		what   string
	}{
		{0, pause, "10–20 ms"},
		{nodeCrowd, func() error { return sleep(ctx, cfg.settle+rand.N(cfg.bound())) }, fmt.Sprintf("%v + up to %v, as the node processes' handover", cfg.settle, cfg.bound())},
		{floorCrowd, func() error { return sleep(ctx, cfg.settle) }, fmt.Sprintf("%v, as the one-process handover", cfg.settle)},
	} {
		others := c.others
		stop, err := crowd(ctx, pool.Config().ConnConfig, channel, others)
		if err != nil {
			return res, err
		}
		o := oneFloor{others: others, pause: c.what}
		for i := range cfg.samples {
			if err := c.pause(); err != nil {
				stop()
				return res, err
			}
			to := "b"
			if i%2 == 1 {
				to = "a"
			}
			t0 := time.Now()
			tag, err := a.Exec(ctx, floorHandOver, name, rev, to, channel)
			if err != nil {
				stop()
				return res, err
			}
			if tag.RowsAffected() != 1 {
				stop()
				return res, fmt.Errorf("floor: handover on revision %d wrote nothing", rev)
			}
			t1 := time.Now()
			if rev, err = notified(); err != nil {
				stop()
				return res, err
			}
			t2 := time.Now()
			o.write = append(o.write, t1.Sub(t0))
			o.samples = append(o.samples, t2.Sub(t0))
		}
		stop()
		res.one = append(res.one, o)
	}
	if _, err := b.Exec(ctx, "UNLISTEN *"); err != nil {
		return res, err
	}
	res.across, res.acrossErr = floorAcross(ctx, cfg, a, name, channel, &rev)
	return res, nil
}

// floorAcross is the one-write floor laid out as the node processes'
// handover is: the successor and the other node each listen in a process
// of their own (bench listen), and the writer's own listening connection
// is read beside it, in this process. The successor is each of the two in
// turn; the sample runs from before the write until the successor's
// process has the notification (its CLOCK_MONOTONIC stamp). It pauses as
// the node processes' handover does.
func floorAcross(ctx context.Context, cfg config, a *pgxpool.Conn, name, channel string, rev *int64) (oneFloor, error) {
	o := oneFloor{others: nodeCrowd, pause: fmt.Sprintf("%v + up to %v, as the node processes' handover", cfg.settle, cfg.bound())}
	stop, err := crowd(ctx, a.Conn().Config(), channel, 1)
	if err != nil {
		return o, err
	}
	defer stop()
	var procs []*listenProc
	defer func() {
		for _, p := range procs {
			p.close()
		}
	}()
	for range 2 {
		p, err := startListener(ctx, cfg.pgURL, channel)
		if err != nil {
			return o, err
		}
		procs = append(procs, p)
	}
	for i := range cfg.samples {
		if err := sleep(ctx, cfg.settle+rand.N(cfg.bound())); err != nil {
			return o, err
		}
		t0 := monotonic()
		tag, err := a.Exec(ctx, floorHandOver, name, *rev, fmt.Sprint(i%2), channel)
		if err != nil {
			return o, err
		}
		if tag.RowsAffected() != 1 {
			return o, fmt.Errorf("floor across processes: handover on revision %d wrote nothing", *rev)
		}
		*rev++
		var t1 int64
		for j, p := range procs {
			mono, err := p.next(ctx, strconv.FormatInt(*rev, 10))
			if err != nil {
				return o, err
			}
			if j == i%2 {
				t1 = mono
			}
		}
		o.samples = append(o.samples, time.Duration(t1-t0))
	}
	return o, nil
}

// crowd opens n connections of their own that LISTEN on channel and read
// its notifications until stop.
func crowd(ctx context.Context, cfg *pgx.ConnConfig, channel string, n int) (stop func(), err error) {
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() { cancel(); wg.Wait() }
	for range n {
		c, err := pgx.ConnectConfig(ctx, cfg.Copy())
		if err != nil {
			stop()
			return nil, err
		}
		if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			_ = c.Close(context.Background())
			stop()
			return nil, err
		}
		wg.Go(func() {
			defer c.Close(context.Background())
			for cctx.Err() == nil {
				if _, err := c.WaitForNotification(cctx); err != nil && cctx.Err() == nil {
					return
				}
			}
		})
	}
	return stop, nil
}
