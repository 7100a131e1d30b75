package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// Many elections across three processes (issue 13): -many-elections
// elections, three node processes, first every election led by one of
// them, then spread over the three. Measured per heartbeat interval: the
// statements each process sends (its pgx tracer), the write statements the
// server ran (pg_stat_statements), the server's CPU time (utime + stime of
// every postgres process in /proc, so only for a server on this machine)
// and its execution time (pg_stat_statements' total_exec_time); the LISTEN
// connections of each process (pg_stat_activity); a crash of the process
// that leads every election (kill -9): the time until each election has a
// new leader. Batched (base.Elections with the postgres BatchStore) and
// not (ElectionsOptions.NoBatch: one statement per election), and etcd's
// concurrency.Election with every election of a process on one session.
// Last, one election's handover and crash failover (the comparison's
// scenarios, fewer samples) with and without the batched elections
// running beside it.

// manyPhase is one steady-state window of one system.
type manyPhase struct {
	label     string
	leaders   map[string]int // elections led, per process
	perProc   map[string]float64
	serverW   float64 // write statements per interval, server (pg_stat_statements)
	serverAll float64 // every statement per interval, server
	execMs    float64 // pg_stat_statements total_exec_time per interval
	cpuMs     float64 // postgres processes' CPU per interval; -1: unknown
	etcdOps   map[string]float64
	listens   map[string]int // LISTEN connections per process
	conns     map[string]int // connections per process
	intervals float64
	changes   int
	unsteady  string // why the phase is not the steady state it names, if it is not
	load      string
	err       error
}

// manyCrash is the failover of every election after kill -9 of the
// process that led them all.
type manyCrash struct {
	label   string
	slot    int             // the killed process's
	samples []time.Duration // per election, kill → new leader
	missing int             // elections without a new leader within the wait
	last    time.Duration
	load    string
	err     error
}

type manyReport struct {
	elections int
	hb        time.Duration
	timing    heartbeat.Timing
	cpuSource string
	phases    []manyPhase
	crashes   []manyCrash
	single    []*cmpResult // handover/crash of one election, alone and beside the many
	loads     []manyLoad   // beside busy loops (load.go)
	notes     []string
}

// loadNow returns the load average as "1m 5m 15m".
func loadNow() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// procStat returns the parent pid and the CPU time (user + system) of
// process pid, from /proc.
func procStat(pid int) (ppid int, cpu time.Duration, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no )", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	ppid, err1 := strconv.Atoi(f[1])
	ut, err2 := strconv.ParseInt(f[11], 10, 64)
	st, err3 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: bad fields", pid)
	}
	return ppid, time.Duration(ut+st) * (time.Second / 100), nil // USER_HZ is 100 on Linux
}

// postmasterPID returns the pid of the server's postmaster when it runs on
// this machine (the parent of this session's backend), else 0.
func postmasterPID(ctx context.Context, pool *pgxpool.Pool) int {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0
	}
	ppid, _, err := procStat(backend)
	if err != nil {
		return 0
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres") {
		return 0
	}
	return ppid
}

// postgresCPU returns the CPU time of the postmaster and its children (the
// server's backends and auxiliary processes; other servers on the machine
// are not counted), or -1 when postmaster is 0.
func postgresCPU(postmaster int) time.Duration {
	if postmaster == 0 {
		return -1
	}
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return -1
	}
	var total time.Duration
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		ppid, cpu, err := procStat(pid)
		if err != nil || (pid != postmaster && ppid != postmaster) {
			continue
		}
		total += cpu
	}
	return total
}

// pgWrites returns pg_stat_statements' calls of write statements on the
// bench table, of every statement, and their total execution time (ms).
func pgWrites(ctx context.Context, pool *pgxpool.Pool) (writes, all int64, execMs float64, err error) {
	err = pool.QueryRow(ctx, `SELECT
		coalesce(sum(calls) FILTER (WHERE query ~* '^\s*(update|insert|with)' AND query ILIKE '%`+pgOptions.Table+`%'), 0)::bigint,
		coalesce(sum(calls), 0)::bigint,
		coalesce(sum(total_exec_time), 0)::float8
		FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND query NOT LIKE '%pg_stat%'`).Scan(&writes, &all, &execMs)
	return
}

// listenConns counts, per application_name starting with prefix, the
// connections whose last statement was LISTEN or pgx's ping (which only
// the LISTEN connection sends between statements), and all connections.
func listenConns(ctx context.Context, pool *pgxpool.Pool, prefix string) (listens, conns map[string]int, err error) {
	rows, err := pool.Query(ctx, `SELECT application_name,
		count(*) FILTER (WHERE query ILIKE 'listen %' OR query = '-- ping')::int, count(*)::int
		FROM pg_stat_activity WHERE application_name LIKE $1 || '%' GROUP BY 1`, prefix)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	listens, conns = map[string]int{}, map[string]int{}
	for rows.Next() {
		var name string
		var l, c int
		if err := rows.Scan(&name, &l, &c); err != nil {
			return nil, nil, err
		}
		listens[name], conns[name] = l, c
	}
	return listens, conns, rows.Err()
}

// newManyCluster is a cluster whose nodes are started one by one
// (c.start), reaching target (a PostgreSQL URL, or an etcd endpoint for
// kind etcd) through proxies of their own.
func newManyCluster(cfg config, kind, scenario, target string, elections int, extra ...string) (*cluster, error) {
	return newManyClusterVia(cfg, kind, scenario, target, elections, true, extra...)
}

// newManyClusterVia is newManyCluster, with the nodes reaching target
// through proxies of their own only if proxied.
func newManyClusterVia(cfg config, kind, scenario, target string, elections int, proxied bool, extra ...string) (*cluster, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	c := &cluster{kind: kind, election: electionName(scenario + "-" + shortKind(kind)), elections: elections, cfg: cfg, pgURL: u,
		events: make(chan nodeEvent, 65536), open: map[string]*belief{}, extra: append([]string{"-lease", cfg.timing.LeaseDuration.String()}, extra...)}
	for range 3 {
		if proxied {
			px, err := newSilentProxy(u.Host, 0)
			if err != nil {
				c.close()
				return nil, err
			}
			c.proxies = append(c.proxies, px)
		}
		c.procs = append(c.procs, nil)
	}
	return c, nil
}

// leaderCounts returns how many elections each live process leads, and
// how many elections have no leader.
func (c *cluster) leaderCounts() (map[string]int, int) {
	out := map[string]int{}
	none := 0
	for i := range c.elections {
		if p := c.leaderOf(i); p != nil {
			out[p.name]++
		} else {
			none++
		}
	}
	return out, none
}

// waitAllLed waits until every election has a live leader; with only, led
// by that process.
func (c *cluster) waitAllLed(ctx context.Context, only *nodeProc, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		counts, none := c.leaderCounts()
		if none == 0 && (only == nil || counts[only.name] == c.elections) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: after %v, leaders %v, %d elections without (%s)", c.kind, d, counts, none, c.leaderless(3))
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

// startOneThenTwo starts node 1, waits until it leads every election, then
// starts nodes 2 and 3. When node 1 cannot lead them all within a minute
// (one statement per election at load 13-19: its renewals did not keep up
// with the leases), it starts the others all the same and says why.
func (c *cluster) startOneThenTwo(ctx context.Context) (unsteady string, err error) {
	if err := c.start(ctx, 0); err != nil {
		return "", err
	}
	if err := c.waitAllLed(ctx, c.procs[0], 60*time.Second); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		unsteady = "the first process alone did not lead every election within 1m0s (" + err.Error() + ")"
		logf("  %s", unsteady)
	}
	for slot := 1; slot < 3; slot++ {
		if err := c.start(ctx, slot); err != nil {
			return "", err
		}
	}
	return unsteady, nil
}

// etcdOps reads the embedded etcd server's counters of store operations.
var etcdOpNames = []string{"etcd_debugging_lease_renewed_total", "etcd_mvcc_put_total", "etcd_mvcc_range_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total"}

func etcdOps() (map[string]float64, error) {
	out := map[string]float64{}
	for _, n := range etcdOpNames {
		v, err := counter(n)
		if err != nil {
			return nil, err
		}
		out[n] = v
	}
	return out, nil
}

// measurePhase leaves c alone for -many-window and measures.
func measurePhase(ctx context.Context, cfg config, c *cluster, pool *pgxpool.Pool, label string) (ph manyPhase) {
	ph = manyPhase{label: label, cpuMs: -1}
	// A lease lost under load leaves its election without a leader until
	// it is claimed again (seen at load 16-19 after the spread): wait for
	// that, -slack bounds at most; if it does not come, measure all the
	// same and say so. Leadership that changes during the window is
	// counted (changes).
	if err := c.waitAllLed(ctx, nil, cfg.within(cfg.bound())); err != nil {
		if ctx.Err() != nil {
			ph.err = ctx.Err()
			return ph
		}
		ph.unsteady = "not every election had a leader at the start of the window (" + err.Error() + ")"
	}
	ph.leaders, _ = c.leaderCounts()
	before := map[int]*nodeProc{}
	for i := range c.elections {
		before[i] = c.leaderOf(i)
	}
	var w0, a0 int64
	var e0 float64
	var cpu0 time.Duration
	var ops0 map[string]float64
	var err error
	etcd := c.kind == kindEtcd
	if etcd {
		if ops0, err = etcdOps(); err != nil {
			ph.err = err
			return ph
		}
	} else {
		if w0, a0, e0, err = pgWrites(ctx, pool); err != nil {
			ph.err = err
			return ph
		}
		cpu0 = postgresCPU(cfg.postmaster)
	}
	var c0 []int64
	if !etcd {
		if c0, err = c.counts(ctx); err != nil {
			ph.err = err
			return ph
		}
	}
	t0 := time.Now()
	if ph.err = sleep(ctx, cfg.manyWindow); ph.err != nil {
		return ph
	}
	iv := float64(time.Since(t0)) / float64(cfg.timing.HeartbeatInterval)
	ph.intervals = iv
	ph.load = loadNow()
	if etcd {
		ops1, err := etcdOps()
		if err != nil {
			ph.err = err
			return ph
		}
		ph.etcdOps = map[string]float64{}
		for k, v := range ops1 {
			ph.etcdOps[k] = (v - ops0[k]) / iv
		}
	} else {
		c1, err := c.counts(ctx)
		if err != nil {
			ph.err = err
			return ph
		}
		cpu1 := postgresCPU(cfg.postmaster)
		w1, a1, e1, err := pgWrites(ctx, pool)
		if err != nil {
			ph.err = err
			return ph
		}
		ph.perProc = map[string]float64{}
		for i, p := range c.procs {
			ph.perProc[p.name] = float64(c1[i]-c0[i]) / iv
		}
		ph.serverW, ph.serverAll, ph.execMs = float64(w1-w0)/iv, float64(a1-a0)/iv, (e1-e0)/iv
		if cpu0 >= 0 && cpu1 >= 0 {
			ph.cpuMs = float64(cpu1-cpu0) / float64(time.Millisecond) / iv
		}
		if ph.listens, ph.conns, err = listenConns(ctx, pool, c.election); err != nil {
			ph.err = err
			return ph
		}
	}
	for i := range c.elections {
		if c.leaderOf(i) != before[i] {
			ph.changes++
		}
	}
	return ph
}

// crashAll kills the process that leads the most elections (every one,
// when the phase before held) and times each of its elections until
// another process leads it.
func crashAll(ctx context.Context, cfg config, c *cluster, label string) (cr manyCrash) {
	cr = manyCrash{label: label}
	var victim *nodeProc
	counts, _ := c.leaderCounts()
	for _, p := range c.procs {
		if victim == nil || counts[p.name] > counts[victim.name] {
			victim = p
		}
	}
	var led []int
	for i := range c.elections {
		if c.leaderOf(i) == victim {
			led = append(led, i)
		}
	}
	if len(led) == 0 {
		cr.err = fmt.Errorf("no process leads an election: %v", counts)
		return cr
	}
	want := make(map[int]bool, len(led))
	for _, i := range led {
		want[i] = true
	}
	c.drain()
	cr.slot = victim.slot
	t0 := monotonic()
	c.kill(victim)
	got := map[int]time.Duration{}
	deadline := t0 + int64(10*cfg.bound()+10*time.Second)
	for len(got) < len(led) {
		ev, err := c.next(ctx, deadline, func(ev nodeEvent) bool { return ev.kind == 'E' && ev.p != victim && want[ev.idx] })
		if err != nil {
			break
		}
		if _, ok := got[ev.idx]; !ok {
			got[ev.idx] = time.Duration(ev.mono - t0)
		}
	}
	cr.load = loadNow()
	cr.missing = len(led) - len(got)
	for _, d := range got {
		cr.samples = append(cr.samples, d)
		cr.last = max(cr.last, d)
	}
	return cr
}

// spread hands about a third of the elections to to: their leaders resign
// them, and to or another process claims them at once; up to three
// rounds. Returns when every election has a leader.
func (c *cluster) spread(ctx context.Context, to *nodeProc) error {
	for range 3 {
		if err := c.waitAllLed(ctx, nil, 30*time.Second); err != nil {
			return err
		}
		sent := 0
		for i := range c.elections {
			if i%3 != 0 {
				continue
			}
			if p := c.leaderOf(i); p != nil && p != to {
				if err := c.send(p, fmt.Sprintf("resign %d", i)); err != nil {
					return err
				}
				sent++
			}
		}
		if sent == 0 {
			break
		}
		if err := sleep(ctx, c.cfg.bound()); err != nil {
			return err
		}
	}
	return c.waitAllLed(ctx, nil, 30*time.Second)
}

// manyConfig is cfg at the many elections' dead-leader bound (-many-ttl),
// with heartbeat.TimingFor(bound): a lease of three heartbeats, so a slow
// batch of renewals (PostgreSQL on a loaded machine) costs no lease.
// (With the bench's default ratios, heartbeat : lease = 1 : 1.5, one
// batch of 1,000 renewals slower than half a heartbeat, seen on this
// machine at load 9, ends every leadership of the process at once.)
func manyConfig(cfg config) (config, error) {
	mcfg := cfg
	mcfg.ttl = cfg.manyTTL
	tf, err := heartbeat.TimingFor(mcfg.bound())
	if err != nil {
		return mcfg, err
	}
	tf.ElectionTimeoutMax = mcfg.bound() // the nodes' -bound
	mcfg.timing = tf
	return mcfg, nil
}

// runMany runs the whole scenario; etcdURL is empty without etcd.
func runMany(ctx context.Context, cfg config, pool *pgxpool.Pool, etcdURL string) *manyReport {
	rep := &manyReport{elections: cfg.manyElections, hb: cfg.timing.HeartbeatInterval,
		cpuSource: "utime+stime of the server's postmaster and its children in /proc: backends, walwriter, checkpointer..."}
	cfg.postmaster = postmasterPID(ctx, pool)
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		rep.notes = append(rep.notes, "pg_stat_statements is not available: "+err.Error())
	}
	if cfg.postmaster == 0 {
		rep.cpuSource = "none: the server does not run on this machine"
	}
	n := cfg.manyElections
	// The many elections run at their own dead-leader bound (-many-ttl),
	// the one election of the handover and crash at the comparison's.
	mcfg, err := manyConfig(cfg)
	if err != nil {
		rep.notes = append(rep.notes, "many: "+err.Error())
		return rep
	}
	mb := mcfg.bound()
	rep.hb = mcfg.timing.HeartbeatInterval
	rep.timing = mcfg.timing
	// One election's handover and crash, alone, first.
	single := func(label string) {
		c := cfg
		c.cmpSamples, c.cmpCrash = cfg.manySamples, cfg.manySamples
		r := &cmpResult{kind: kindLeaderfeed, label: label, cfg: c, checks: map[string]overlapStats{},
			handover: series{scenario: "one election's handover", system: label}, crash: series{scenario: "one election's crash", system: label}}
		if err := cmpHandover(ctx, c, r); err != nil {
			r.fail("handover", err)
		}
		if err := cmpCrash(ctx, c, r); err != nil {
			r.fail("crash", err)
		}
		logSeries(series{scenario: "handover", system: label, samples: r.handover.samples})
		logSeries(series{scenario: "crash", system: label, samples: r.crash.samples})
		rep.single = append(rep.single, r)
	}
	logf("many elections: one election's handover and crash alone (%d samples each, load %s)", cfg.manySamples, loadNow())
	single("alone")

	for _, mode := range []struct {
		label string
		extra []string
	}{{"batched", nil}, {"one statement per election", []string{"-nobatch"}}} {
		logf("many elections: leaderfeed/postgres %s, %d elections, 3 processes (load %s)", mode.label, n, loadNow())
		c, err := newManyCluster(mcfg, kindLeaderfeed, "many", cfg.pgURL, n, mode.extra...)
		if err != nil {
			rep.phases = append(rep.phases, manyPhase{label: mode.label, err: err})
			continue
		}
		func() {
			defer c.close()
			unsteady, err := c.startOneThenTwo(ctx)
			if err != nil {
				rep.phases = append(rep.phases, manyPhase{label: mode.label + ", all led by one", err: err})
				return
			}
			if err := sleep(ctx, 2*mb); err != nil {
				return
			}
			ph := measurePhase(ctx, mcfg, c, pool, mode.label+", all led by one")
			ph.unsteady = joinNonEmpty(unsteady, ph.unsteady)
			logPhase(ph)
			rep.phases = append(rep.phases, ph)
			cr := crashAll(ctx, mcfg, c, "leaderfeed/postgres, "+mode.label)
			logCrash(cr)
			rep.crashes = append(rep.crashes, cr)
			if cr.err != nil {
				return
			}
			// A new process in the killed one's place: the first, unless
			// leadership had moved (one statement per election at load 17),
			// when starting the first again lost the live first process
			// from the cluster. The survivors hand it a third.
			if err := c.start(ctx, cr.slot); err != nil {
				rep.phases = append(rep.phases, manyPhase{label: mode.label + ", spread", err: err})
				return
			}
			// One statement per election at load 8-17 does not hold: every
			// election can be without a leader at once. Measure what there
			// is, marked.
			unsteady = ""
			if err := c.spread(ctx, c.procs[cr.slot]); err != nil {
				if ctx.Err() != nil {
					return
				}
				unsteady = "the spread did not complete (" + err.Error() + ")"
				logf("  %s", unsteady)
			}
			if err := sleep(ctx, mb); err != nil {
				return
			}
			ph = measurePhase(ctx, mcfg, c, pool, mode.label+", spread")
			ph.unsteady = joinNonEmpty(unsteady, ph.unsteady)
			logPhase(ph)
			rep.phases = append(rep.phases, ph)
			if mode.extra == nil {
				logf("many elections: one election's handover and crash beside the %d batched elections (load %s)", n, loadNow())
				single(fmt.Sprintf("beside %d batched elections", n))
			}
		}()
	}

	if etcdURL != "" {
		logf("many elections: etcd, %d elections on one session per process, 3 processes (load %s)", n, loadNow())
		c, err := newManyCluster(mcfg, kindEtcd, "many", etcdURL, n)
		if err != nil {
			rep.phases = append(rep.phases, manyPhase{label: "etcd", err: err})
			return rep
		}
		defer c.close()
		unsteady, err := c.startOneThenTwo(ctx)
		if err != nil {
			rep.phases = append(rep.phases, manyPhase{label: "etcd, all led by one", err: err})
			return rep
		}
		if err := sleep(ctx, 2*mb); err != nil {
			return rep
		}
		ph := measurePhase(ctx, mcfg, c, nil, "etcd, all led by one")
		ph.unsteady = joinNonEmpty(unsteady, ph.unsteady)
		logPhase(ph)
		rep.phases = append(rep.phases, ph)
		cr := crashAll(ctx, mcfg, c, "etcd")
		logCrash(cr)
		rep.crashes = append(rep.crashes, cr)
	}
	return rep
}

// joinNonEmpty joins the non-empty strings with "; ".
func joinNonEmpty(ss ...string) string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, "; ")
}

func logPhase(ph manyPhase) {
	if ph.err != nil {
		logf("  %s: FAILED: %v", ph.label, ph.err)
		return
	}
	logf("  %s: leaders %v; per process %s statements/interval; server writes %.2f, all %.2f, exec %.2f ms, CPU %.1f ms per interval; LISTEN %v of conns %v; etcd %v; %d leader changes; load %s",
		ph.label, ph.leaders, fmtMap(ph.perProc), ph.serverW, ph.serverAll, ph.execMs, ph.cpuMs, ph.listens, ph.conns, fmtMap(ph.etcdOps), ph.changes, ph.load)
	if ph.unsteady != "" {
		logf("  %s: not steady: %s", ph.label, ph.unsteady)
	}
}

func logCrash(cr manyCrash) {
	if cr.err != nil {
		logf("  crash %s: FAILED: %v", cr.label, cr.err)
		return
	}
	s := summarize(cr.samples)
	logf("  crash %s: %d elections, p50 %s p99 %s ms, last %s ms, %d without a new leader; load %s", cr.label, s.n, ms(s.p50), ms(s.p99), ms(cr.last), cr.missing, cr.load)
}

func fmtMap(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.2f", k, m[k])
	}
	return "{" + b.String() + "}"
}

// markdown is the many-elections section of results.md.
func (m *manyReport) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("## Many elections: %d elections across 3 processes (issue 13)\n\n", m.elections)
	p("leaderfeed timing of the many elections: heartbeat %v, election timeout %v–%v, lease %v; etcd session TTL %v (the same dead-leader bound). Each process is a node process of its own; leaderfeed's share one `base.Elections` on one `postgres.Store` per process (batched: renewals in one `UPDATE ... FROM unnest(...)`; one statement per election: `ElectionsOptions{NoBatch: true}`); etcd's are `concurrency.NewElection` on one session per process (TTL = the bound). \"All led by one\": the first process was started alone and won every election, then the other two started. \"Spread\": the first then resigned two elections in three, which the others claimed. Per process: statements the process sent per interval (its pgx tracer; a batch's statements count one each). Server: write statements on the table per interval (pg_stat_statements calls of UPDATE/INSERT), all statements, their execution time (pg_stat_statements total_exec_time) and the server's CPU (%s) per interval. LISTEN: per process, connections whose last statement was LISTEN or the listener's ping (pg_stat_activity, by application_name). etcd: the server's counters per interval (all three sessions).\n\n", m.timing.HeartbeatInterval, m.timing.ElectionTimeoutMin, m.timing.ElectionTimeoutMax, m.timing.LeaseDuration, m.timing.ElectionTimeoutMax, m.cpuSource)
	p("| system, phase | elections led per process | statements/interval per process | server write stmts/interval | server stmts/interval | server exec ms/interval | server CPU ms/interval | LISTEN conns per process | leader changes | load (1/5/15) |\n")
	p("| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |\n")
	var batchedCPU, unbatchedCPU, batchedExec, unbatchedExec float64
	var batchedChanges, unbatchedChanges int
	var unsteady []string
	for _, ph := range m.phases {
		if ph.err == nil && ph.unsteady != "" {
			unsteady = append(unsteady, fmt.Sprintf("- %s: not the steady state it names: %s; its figures include the claims.", ph.label, ph.unsteady))
		}
		if ph.err != nil {
			p("| %s | failed: %v | | | | | | | | |\n", ph.label, ph.err)
			continue
		}
		if ph.etcdOps != nil {
			var total float64
			for _, v := range ph.etcdOps {
				total += v
			}
			p("| %s | %s | – | %.2f (etcd: lease keepalives %.2f, puts %.2f, ranges %.2f, deletes %.2f, txns %.2f) | %.2f | – | – | – | %d | %s |\n", ph.label, fmtCounts(ph.leaders),
				ph.etcdOps["etcd_mvcc_put_total"]+ph.etcdOps["etcd_mvcc_delete_total"], ph.etcdOps["etcd_debugging_lease_renewed_total"], ph.etcdOps["etcd_mvcc_put_total"],
				ph.etcdOps["etcd_mvcc_range_total"], ph.etcdOps["etcd_mvcc_delete_total"], ph.etcdOps["etcd_mvcc_txn_total"], total, ph.changes, ph.load)
			continue
		}
		cpu := "–"
		if ph.cpuMs >= 0 {
			cpu = fmt.Sprintf("%.1f", ph.cpuMs)
		}
		listens := map[string]float64{}
		for k, v := range ph.listens {
			listens[k] = float64(v)
		}
		p("| %s | %s | %s | %.2f | %.2f | %.2f | %s | %s | %d | %s |\n", ph.label, fmtCounts(ph.leaders), fmtShort(ph.perProc), ph.serverW, ph.serverAll, ph.execMs, cpu, fmtShort(listens), ph.changes, ph.load)
		switch {
		case ph.unsteady != "": // no ratio from it
		case strings.HasPrefix(ph.label, "batched, all"):
			batchedCPU, batchedExec, batchedChanges = ph.cpuMs, ph.execMs, ph.changes
		case strings.HasPrefix(ph.label, "one statement per election, all"):
			unbatchedCPU, unbatchedExec, unbatchedChanges = ph.cpuMs, ph.execMs, ph.changes
		}
	}
	if len(unsteady) > 0 {
		p("\n%s\n", strings.Join(unsteady, "\n"))
	}
	if batchedCPU > 0 && unbatchedCPU > 0 {
		p("\nServer CPU, all led by one: one statement per election / batched = %.1f× (execution time %.1f×; leader changes in the windows %d and %d).\n", unbatchedCPU/batchedCPU, unbatchedExec/max(batchedExec, 1e-9), unbatchedChanges, batchedChanges)
	}
	p("\n### Crash of the process that leads every election (kill -9)\n\nRight after the \"all led by one\" window, the process leading the most elections (all of them, unless some moved) is killed; per election of its, the time from the kill until another process leads it.\n\n")
	p("| system | elections with a new leader | p50 ms | p99 ms | last ms | load (1/5/15) |\n| --- | ---: | ---: | ---: | ---: | --- |\n")
	for _, cr := range m.crashes {
		if cr.err != nil {
			p("| %s | failed: %v | | | | |\n", cr.label, cr.err)
			continue
		}
		s := summarize(cr.samples)
		p("| %s | %d of %d | %s | %s | %s | %s |\n", cr.label, s.n, s.n+cr.missing, ms(s.p50), ms(s.p99), ms(cr.last), cr.load)
	}
	p("\n### One election beside the many\n\nThe comparison's handover (resign → another process leads) and crash (kill -9 of the leader → another process leads), leaderfeed, 3 node processes, one election, alone and while the batched elections above run spread over their 3 processes.\n\n")
	p("| one election | handover p50 / p99 / max ms | crash p50 / p99 / max ms | overlaps |\n| --- | --- | --- | ---: |\n")
	for _, r := range m.single {
		h, c := summarize(r.handover.samples), summarize(r.crash.samples)
		ov := 0
		for _, st := range r.checks {
			ov += st.count
		}
		p("| %s | %s / %s / %s (n=%d) | %s / %s / %s (n=%d) | %d |\n", r.label, ms(h.p50), ms(h.p99), ms(h.max), h.n, ms(c.p50), ms(c.p99), ms(c.max), c.n, ov)
	}
	for _, r := range m.single {
		for _, s := range []series{r.handover, r.crash} {
			if n := s.lost.total(); n > 0 {
				p("\n- %s, %s: lost rounds: %d, retried (%s).\n", s.scenario, r.label, n, s.lost)
			}
		}
		for _, e := range r.errs {
			p("\n- %s failed: %s.\n", r.label, e)
		}
	}
	p("%s", loadMarkdown(m.loads, m.timing.ElectionTimeoutMax, m.hb, m.elections))
	for _, n := range m.notes {
		p("\n%s\n", n)
	}
	return b.String()
}

// fmtCounts writes the per-process counts with short process names.
func fmtCounts(m map[string]int) string {
	f := map[string]float64{}
	for k, v := range m {
		f[k] = float64(v)
	}
	return fmtShort(f)
}

// fmtShort writes a per-process map as "n1 3.00, n2 ..." (the node's slot
// and start, without the kind).
func fmtShort(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		name := k
		if j := strings.LastIndexByte(k, '/'); j >= 0 {
			name = k[j+1:]
		}
		v := m[k]
		if v == float64(int64(v)) {
			fmt.Fprintf(&b, "%s %d", name, int64(v))
		} else {
			fmt.Fprintf(&b, "%s %.2f", name, v)
		}
	}
	return b.String()
}
