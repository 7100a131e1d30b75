// Command bench measures leaderfeed against etcd's concurrency.Election in
// one process and one run: clean handover, crash failover at the same
// dead-leader bound, the time an observer takes to learn the new leader,
// store writes per heartbeat interval, and notification fan-out to 10, 100
// and 1,000 followers. It writes a Markdown table (results.md) and a plot
// of the latency distributions (latency.png) to -out.
//
// leaderfeed runs on the memory backend always, and on PostgreSQL when a
// URL is given (-postgres, or LEADERFEED_POSTGRES_URL). etcd runs embedded
// on loopback, with its data in a temporary directory removed at exit.
// bench/run.sh starts a throwaway PostgreSQL when no URL is given.
//
// On PostgreSQL it also compares leaderfeed with the two electors a team
// on PostgreSQL usually writes instead (a session advisory lock, a polling
// lease table; baselines.go), each node a process of its own ("bench node",
// node.go) behind a proxy that can cut it silently (proxy.go): clean
// handover, kill -9, silent cut, with a leadership checker over all three
// (cluster.go); steady-state statements and WAL; and the floor of a
// handover in bare pgx (compare.go). The results follow in results.md and
// compare.png.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/memory"
	"github.com/leaderfeed/leaderfeed/postgres"
)

// config is what the flags set.
type config struct {
	out          string
	docs         string // docs/BENCHMARKS.md to write the run's tables into; "": none
	pgURL        string
	mongoURL     string
	rethinkAddr  string
	samples      int
	crashSamples int
	fanoutRounds int
	fanout       []int
	intervals    int
	ttl          int
	strict       bool
	diagJitter   time.Duration // 0: no diagnostic handover
	settle       time.Duration
	noPresence   bool
	nodeDebug    bool
	slack        float64          // waits allow slack × what the timing promises
	timing       heartbeat.Timing // leaderfeed's, derived from ttl

	old             bool // the scenarios against etcd
	compare         bool // the comparison with the advisory lock and the polling lease
	cmpSamples      int
	cmpCrash        int
	cmpCut          int
	cutWait         time.Duration
	serverKeepalive time.Duration
	shortKeepalive  time.Duration
	costWindow      time.Duration
	costElections   []int
	advRetry        time.Duration

	many          bool // many elections across three processes (many.go)
	manyElections int
	manyWindow    time.Duration
	manySamples   int
	manyTTL       int
	postmaster    int // many: the local server's postmaster pid; 0: not local
	manyLoad      time.Duration
	manyLoadModes []string
	manyLoadSpin  int
	manyLoadConns int

	rollout      bool // rolling restarts of node processes (rollout.go)
	rolloutNodes int
	rollouts     int
	rolloutTTL   int
	rolloutPause time.Duration

	fence         bool // what fenced transactions cost a leader (fence.go)
	fenceDuration time.Duration

	memory          bool // many elections in one process on memory (memmany.go)
	memoryElections []int
	memoryIntervals int
}

// bound is the dead-leader bound (-ttl).
func (c config) bound() time.Duration { return time.Duration(c.ttl) * time.Second }

// within is how long the run waits for something the timing in use
// promises within d (a new leader within the election timeout or the
// session TTL, a follower that learns of it): -slack × d, room for a
// loaded machine. A wait that runs out loses that round, counted and
// retried (series.lose), not the run.
func (c config) within(d time.Duration) time.Duration {
	return time.Duration(c.slack * float64(d))
}

// parseSizes parses a comma-separated list of positive integers.
func parseSizes(flagName, list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-%s: bad size %q (want positive integers separated by commas)", flagName, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&c.out, "out", "out", "folder for results.md and latency.png")
	fs.StringVar(&c.docs, "docs", "", "write the run's tables into this file (docs/BENCHMARKS.md) between its bench run markers; empty: don't (bench/run.sh sets it when it writes docs/bench)")
	fs.StringVar(&c.pgURL, "postgres", os.Getenv("LEADERFEED_POSTGRES_URL"), "PostgreSQL URL (default $LEADERFEED_POSTGRES_URL); empty: skip PostgreSQL (bench/run.sh starts one)")
	fs.StringVar(&c.mongoURL, "mongo", os.Getenv("LEADERFEED_MONGO_URL"), "MongoDB URL, a replica set (default $LEADERFEED_MONGO_URL); empty: skip MongoDB")
	fs.StringVar(&c.rethinkAddr, "rethink", os.Getenv("LEADERFEED_RETHINK_ADDR"), "RethinkDB host:port (default $LEADERFEED_RETHINK_ADDR); empty: skip RethinkDB")
	fs.IntVar(&c.samples, "samples", 250, "handover and observer samples per system")
	fs.IntVar(&c.crashSamples, "crash-samples", 100, "crash failover samples per system (about 1.5 s each; the systems run side by side)")
	fs.IntVar(&c.fanoutRounds, "fanout-rounds", 100, "handovers per fan-out size; samples = rounds × followers")
	sizes := fs.String("fanout", "10,100,1000", "fan-out sizes (followers)")
	fs.IntVar(&c.intervals, "intervals", 40, "heartbeat intervals to count writes over")
	fs.IntVar(&c.ttl, "ttl", 1, "dead-leader bound in seconds: etcd's session TTL and leaderfeed's ElectionTimeoutMax")
	fs.BoolVar(&c.strict, "strict", true, "also measure leaderfeed's crash failover (on PostgreSQL, else memory) with ElectionTimeoutMin = ElectionTimeoutMax = TTL")
	fs.DurationVar(&c.diagJitter, "diag-jitter", 2*time.Millisecond, "also measure leaderfeed's handover (on PostgreSQL, else memory) with this VacancyJitter (default 0), to show what a jitter costs; 0: don't")
	fs.DurationVar(&c.settle, "settle", 150*time.Millisecond, "pause before each handover; keep it above etcd's 100 ms watcher sync period")
	fs.Float64Var(&c.slack, "slack", 10, "a wait for what the timing promises within d (a new leader within the election timeout or session TTL) allows slack × d; a wait that runs out loses that round (counted, retried), not the run")
	fs.BoolVar(&c.old, "etcd", true, "run the scenarios against etcd (handover, observer, fan-out, writes, crash); false: only the comparison")
	fs.BoolVar(&c.compare, "compare", true, "on PostgreSQL, compare leaderfeed with a session advisory lock elector and a polling lease elector, as separate node processes")
	fs.IntVar(&c.cmpSamples, "cmp-samples", 100, "comparison: handover samples per elector (each about 0.15 s + a random pause of up to -ttl + the handover)")
	fs.IntVar(&c.cmpCrash, "cmp-crash", 50, "comparison: kill -9 samples per elector (electors side by side)")
	fs.IntVar(&c.cmpCut, "cmp-cut", 10, "comparison: silent-cut samples per elector (electors side by side; each takes up to -cut-wait)")
	fs.DurationVar(&c.cutWait, "cut-wait", 10*time.Second, "comparison: how long a cut sample waits for the old leader to step down and a new one")
	fs.DurationVar(&c.serverKeepalive, "server-keepalive", 3*time.Second, "comparison: after a cut, the proxy resets the server's side of the cut connections after this long, standing in for the server's TCP keepalive (PostgreSQL's default, the kernel's, is about 2 h); 0: never")
	fs.DurationVar(&c.shortKeepalive, "server-keepalive-short", time.Second, "comparison: cut the advisory lock elector once more with this server keepalive, shorter than the holder's own check can take (up to two retry periods); 0: don't")
	fs.DurationVar(&c.costWindow, "cost-window", 10*time.Second, "comparison: steady-state window over which statements and WAL are counted")
	costSizes := fs.String("cost-elections", "1,100", "comparison: numbers of elections for the steady-state cost")
	fs.DurationVar(&c.advRetry, "adv-retry", 0, "comparison: the advisory lock elector's retry period (default: the -ttl bound)")
	fs.BoolVar(&c.many, "many", true, "on PostgreSQL, many elections across three processes: statements, server CPU and LISTEN connections batched and not, crash of the process leading them all, etcd side by side")
	fs.IntVar(&c.manyElections, "many-elections", 1000, "many: elections")
	fs.DurationVar(&c.manyWindow, "many-window", 10*time.Second, "many: steady-state window of each phase")
	fs.IntVar(&c.manyTTL, "many-ttl", 4, "many: the dead-leader bound in seconds of the many elections (etcd's session TTL, leaderfeed's ElectionTimeoutMax; 4: leaderfeed's default timing, heartbeat 1 s)")
	fs.BoolVar(&c.nodeDebug, "node-debug", false, "every node process reports on stderr (the run's log) what its -debug reports: leaderfeed's failed and slow renewals, failed claims and its pool's statements every second")
	fs.BoolVar(&c.noPresence, "no-presence", false, "the handover candidates do not participate: Resign writes a vacancy they race to claim (two writes), instead of handing over in one write")
	fs.IntVar(&c.manySamples, "many-samples", 20, "many: handover and crash samples of one election, alone and beside the many")
	fs.DurationVar(&c.manyLoad, "many-load", 5*time.Minute, "many: run the elections this long beside busy loops (-many-load-spin) and count the elections without a leader for longer than their bound; 0: don't")
	loadModes := fs.String("many-load-modes", "nobatch", "many: the modes run beside busy loops: nobatch (ElectionsOptions.NoBatch, one statement per election), batched, or both separated by commas")
	fs.IntVar(&c.manyLoadSpin, "many-load-spin", 2, "many: busy loops (processes) beside the elections, one per core on 2 cores")
	fs.IntVar(&c.manyLoadConns, "many-load-conns", 4, "many: the pool size (MaxConns) of each node process beside busy loops")
	fs.BoolVar(&c.fence, "fence", true, "on PostgreSQL, what postgres.Fence costs a leader: renewals and transactions without and with the fence (as bench fence, 100 transactions a second held 5 ms)")
	fs.DurationVar(&c.fenceDuration, "fence-duration", 30*time.Second, "fence: length of each of the two phases")
	fs.BoolVar(&c.memory, "memory", true, "many elections in one process on the memory backend (go test -bench ManyElections in ../memory): resident memory, CPU, statements, goroutines, failed renewals")
	memSizes := fs.String("memory-elections", "10000,100000", "memory: numbers of elections")
	fs.IntVar(&c.memoryIntervals, "memory-intervals", 5, "memory: heartbeat intervals (1 s) measured per size")
	fs.BoolVar(&c.rollout, "rollout", true, "on PostgreSQL, rolling restarts of node processes: leader changes and leaderless time per rollout, leaderfeed beside the advisory lock and the polling lease")
	fs.IntVar(&c.rolloutNodes, "rollout-nodes", 5, "rollout: node processes")
	fs.IntVar(&c.rollouts, "rollouts", 10, "rollout: rollouts per elector")
	fs.DurationVar(&c.rolloutPause, "rollout-pause", time.Second, "rollout: pause between one step's stop and the next step's start (a real node's start-up and readiness)")
	fs.IntVar(&c.rolloutTTL, "rollout-ttl", 4, "rollout: the dead-leader bound in seconds (leaderfeed's ElectionTimeoutMax, the advisory lock's retry period, the lease's TTL; 4: leaderfeed's default timing)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	var err error
	if c.fanout, err = parseSizes("fanout", *sizes); err != nil {
		return c, err
	}
	if c.costElections, err = parseSizes("cost-elections", *costSizes); err != nil {
		return c, err
	}
	if c.memoryElections, err = parseSizes("memory-elections", *memSizes); err != nil {
		return c, err
	}
	for _, m := range strings.Split(*loadModes, ",") {
		switch m = strings.TrimSpace(m); m {
		case "nobatch", "batched":
			c.manyLoadModes = append(c.manyLoadModes, m)
		default:
			return c, fmt.Errorf("-many-load-modes: unknown mode %q (want nobatch or batched)", m)
		}
	}
	if c.slack < 1 {
		return c, fmt.Errorf("-slack must be at least 1, not %v", c.slack)
	}
	if c.ttl < 1 || c.manyTTL < 1 {
		return c, errors.New("-ttl and -many-ttl must be at least 1 (etcd's lease TTLs are whole seconds)")
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"samples", c.samples}, {"crash-samples", c.crashSamples}, {"fanout-rounds", c.fanoutRounds}, {"intervals", c.intervals},
		{"cmp-samples", c.cmpSamples}, {"cmp-crash", c.cmpCrash}, {"cmp-cut", c.cmpCut}, {"many-elections", c.manyElections}, {"many-samples", c.manySamples},
		{"memory-intervals", c.memoryIntervals}, {"many-load-spin", c.manyLoadSpin}, {"many-load-conns", c.manyLoadConns}, {"rollout-nodes", c.rolloutNodes}, {"rollouts", c.rollouts}, {"rollout-ttl", c.rolloutTTL}} {
		if v.n < 1 {
			return c, fmt.Errorf("-%s must be at least 1, not %d", v.name, v.n)
		}
	}
	if c.cutWait < time.Second || c.costWindow < time.Second || c.manyWindow < time.Second || c.fenceDuration < time.Second {
		return c, errors.New("-cut-wait, -cost-window, -many-window and -fence-duration must be at least 1s")
	}
	if c.serverKeepalive < 0 || c.shortKeepalive < 0 || c.advRetry < 0 || c.rolloutPause < 0 {
		return c, errors.New("-server-keepalive, -server-keepalive-short, -adv-retry and -rollout-pause must not be negative")
	}
	if c.advRetry == 0 {
		c.advRetry = c.bound()
	}
	// The default timing scaled down to the bound: heartbeat : timeout min
	// : timeout max = 1 : 2 : 4 (1 s, 2 s, 4 s by default).
	bound := time.Duration(c.ttl) * time.Second
	c.timing = heartbeat.Timing{HeartbeatInterval: bound / 4, ElectionTimeoutMin: bound / 2, ElectionTimeoutMax: bound}.WithDefaults()
	return c, c.timing.Validate()
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "node" {
		if err := nodeMain(os.Args[2:]); err != nil {
			if !errors.Is(err, flag.ErrHelp) {
				fmt.Fprintln(os.Stderr, "bench:", err)
			}
			os.Exit(2)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "listen" {
		if err := listenMain(os.Args[2:]); err != nil && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "spin" {
		spinMain()
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "fence" {
		if err := fenceMain(os.Args[2:]); err != nil && !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func memorySystem() *lfSystem {
	store := memory.NewDB()
	return &lfSystem{name: "leaderfeed/memory", open: func(_ context.Context, election string, _ bool) (backend.Election, func(), error) {
		b, err := store.Election(election)
		return b, func() {}, err
	}}
}

var pgOptions = postgres.Options{Table: "leaderfeed_bench", ChannelPrefix: "leaderfeed_bench"}

// postgresSystem prepares the table and returns the system, the server's
// version, the shared pool and a function that closes what it opened
// (the pool too).
func postgresSystem(ctx context.Context, url string) (*lfSystem, string, *pgxpool.Pool, func(), error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", nil, nil, fmt.Errorf("postgres: %w", err)
	}
	pcfg.MaxConns = 16
	shared, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, "", nil, nil, fmt.Errorf("postgres: %w", err)
	}
	var version string
	if err := shared.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		shared.Close()
		return nil, "", nil, nil, fmt.Errorf("postgres: %w (is the server at -postgres up?)", err)
	}
	b, err := postgres.New(shared, "bench-setup", pgOptions)
	if err == nil {
		if err = b.Start(ctx); err == nil {
			err = b.Create(ctx)
		}
		_ = b.Close()
	}
	if err != nil {
		shared.Close()
		return nil, "", nil, nil, err
	}
	// Observers in this process (the fan-out's followers) share one
	// Elections, so one LISTEN connection, as a service would; nodes that
	// stand for processes of their own get a pool and a Store each.
	st, err := postgres.NewStore(shared, pgOptions)
	if err != nil {
		shared.Close()
		return nil, "", nil, nil, err
	}
	observers, err := base.NewElections(st, base.ElectionsOptions{})
	if err != nil {
		shared.Close()
		return nil, "", nil, nil, err
	}
	open := func(ctx context.Context, election string, own bool) (backend.Election, func(), error) {
		if !own {
			b, err := observers.Observer(election)
			return b, func() {}, err
		}
		c := pcfg.Copy()
		c.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, c)
		if err != nil {
			return nil, nil, err
		}
		b, err := postgres.New(pool, election, pgOptions)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return b, pool.Close, nil
	}
	closeAll := func() {
		_ = observers.Close()
		shared.Close()
	}
	return &lfSystem{name: "leaderfeed/postgres", open: open}, version, shared, closeAll, nil
}

// mainSystem is the one the targets are about: PostgreSQL if measured,
// else memory.
func mainSystem(systems []*lfSystem) *lfSystem {
	for _, s := range systems {
		if s.name == "leaderfeed/postgres" {
			return s
		}
	}
	return systems[0]
}

func run(ctx context.Context, cfg config) error {
	leaderfeedCommit() // before this run writes anything
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	rep := &report{cfg: cfg, started: time.Now(), load0: loadavg(), args: os.Args[1:]}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	selfExe = exe // re-executed as "bench node"

	systems := []*lfSystem{memorySystem()}
	var pgPool *pgxpool.Pool
	if cfg.pgURL != "" {
		pg, version, pool, closePG, err := postgresSystem(ctx, cfg.pgURL)
		if err != nil {
			return err
		}
		defer closePG()
		pgPool = pool
		rep.pgVersion = version
		systems = append(systems, pg)
	} else {
		logf("no PostgreSQL URL: skipping leaderfeed/postgres (give -postgres or LEADERFEED_POSTGRES_URL, or use bench/run.sh, which starts a server)")
		rep.skipped = append(rep.skipped, "leaderfeed/postgres: no URL given")
	}
	if cfg.mongoURL != "" {
		s, closeMongo, err := mongoSystem(ctx, cfg.mongoURL)
		if err != nil {
			return err
		}
		defer closeMongo()
		systems = append(systems, s)
	} else {
		rep.skipped = append(rep.skipped, "leaderfeed/mongo: no server given (-mongo or LEADERFEED_MONGO_URL)")
	}
	if cfg.rethinkAddr != "" {
		s, closeRethink, err := rethinkSystem(ctx, cfg.rethinkAddr)
		if err != nil {
			return err
		}
		defer closeRethink()
		systems = append(systems, s)
		if os.Getenv("LEADERFEED_RETHINK_REQLITE") == "1" {
			rep.caveats = append(rep.caveats, "leaderfeed/rethink ran on reqlite, a RethinkDB stand-in in JavaScript, not on RethinkDB: its numbers say nothing about a real server")
		}
	} else {
		rep.skipped = append(rep.skipped, "leaderfeed/rethink: no server given (-rethink or LEADERFEED_RETHINK_ADDR)")
	}
	if cfg.old {
		if err := runOld(ctx, cfg, rep, systems); err != nil {
			return err
		}
	}
	if cfg.compare && pgPool != nil {
		c, err := runCompare(ctx, cfg, pgPool)
		if err != nil {
			return err
		}
		rep.cmp = c
	} else if cfg.compare {
		rep.skipped = append(rep.skipped, "the comparison with the advisory lock and the polling lease: no PostgreSQL URL given")
	}

	var fence string
	if cfg.fence && pgPool != nil {
		logf("fenced transactions: two phases of %v (load %s)", cfg.fenceDuration, loadNow())
		md, err := runFence(ctx, cfg.pgURL, cfg.fenceDuration, 100, 5*time.Millisecond)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			md = fmt.Sprintf("\nFailed: %v.\n", err)
		}
		logf("%s", md)
		fence = "## Fenced transactions (issue 42)\n\nWhat `postgres.Fence` costs a leader: its `Run` job runs 100 transactions a second, each held open 5 ms after the fence (whose `FOR SHARE` lock holds off the leader's own renewals meanwhile), while a second node follows; a phase without the fence, then one with it, on a table of its own (`bench fence` runs the same alone).\n" + md
	} else if cfg.fence {
		rep.skipped = append(rep.skipped, "fenced transactions: no PostgreSQL URL given")
	}

	var rollout *rolloutReport
	if cfg.rollout && pgPool != nil {
		rollout = runRollouts(ctx, cfg, pgPool)
		if err := ctx.Err(); err != nil {
			return err
		}
	} else if cfg.rollout {
		rep.skipped = append(rep.skipped, "rolling restarts: no PostgreSQL URL given")
	}

	// Before the many elections: their busy loops leave the load average
	// high for minutes after, and this part measures CPU time.
	var mem *memoryReport
	if cfg.memory {
		mem = runMemoryMany(ctx, cfg)
		if err := ctx.Err(); err != nil {
			return err
		}
	}

	var many *manyReport
	if cfg.many && pgPool != nil {
		etcd, err := startEtcd(cfg.ttl)
		if err != nil {
			return err
		}
		many = runMany(ctx, cfg, pgPool, etcd.endpoints[0])
		etcd.close()
		if cfg.manyLoad > 0 && ctx.Err() == nil {
			many.loads = runManyLoad(ctx, cfg, pgPool)
		}
	} else if cfg.many {
		rep.skipped = append(rep.skipped, "many elections across three processes: no PostgreSQL URL given")
	}

	rep.finished = time.Now()
	rep.load1 = loadavg()
	md := filepath.Join(cfg.out, "results.md")
	text := rep.markdown()
	if fence != "" {
		text += "\n" + fence
	}
	if rollout != nil {
		text += "\n" + rollout.markdown()
	}
	if many != nil {
		text += "\n" + many.markdown()
	}
	if mem != nil {
		text += "\n" + mem.markdown()
	}
	if err := os.WriteFile(md, []byte(text), 0o644); err != nil {
		return err
	}
	if cfg.docs != "" {
		if err := writeDocs(cfg.docs, runResults{rep: rep, fence: fence, rollout: rollout, many: many, mem: mem}); err != nil {
			return err
		}
	}
	png := filepath.Join(cfg.out, "latency.png")
	if err := plotLatency(png, rep.series); err != nil {
		return err
	}
	written := []string{md, png}
	if cfg.docs != "" {
		written = append(written, cfg.docs)
	}
	if rep.cmp != nil {
		cpng := filepath.Join(cfg.out, "compare.png")
		if err := plotCompare(cpng, rep.cmp); err != nil {
			return err
		}
		written = append(written, cpng)
	}
	fmt.Print(text)
	logf("wrote %s in %v", strings.Join(written, ", "), rep.finished.Sub(rep.started).Round(time.Second))
	return nil
}

// runOld runs the scenarios against etcd (issue 8).
func runOld(ctx context.Context, cfg config, rep *report, systems []*lfSystem) error {
	etcd, err := startEtcd(cfg.ttl)
	if err != nil {
		return err
	}
	defer etcd.close()
	logf("etcd %s on %s; leaderfeed timing %+v; etcd session TTL %d s", etcdVersion(), etcd.endpoints[0], cfg.timing, cfg.ttl)

	record := func(s series, err error) {
		if err != nil {
			logf("  %s %s: FAILED: %v", s.scenario, s.system, err)
			s.note = "failed: " + err.Error()
		} else {
			sum := summarize(s.samples)
			logf("  %s %s: n=%d p50=%s p99=%s max=%s ms", s.scenario, s.system, sum.n, ms(sum.p50), ms(sum.p99), ms(sum.max))
		}
		rep.series = append(rep.series, s)
	}

	logf("handover and observer (%d samples each)", cfg.samples)
	for _, s := range systems {
		h, o, err := s.handover(ctx, cfg)
		record(h, err)
		record(o, err)
	}
	h, o, err := etcd.handover(ctx, cfg)
	record(h, err)
	record(o, err)
	if cfg.diagJitter > 0 {
		// What does a vacancy jitter cost a handover? (None by default;
		// 2 ms was the default before.)
		d := cfg
		d.timing.VacancyJitter = cfg.diagJitter
		s := mainSystem(systems)
		h, _, err := s.handover(ctx, d)
		h.scenario = "handover-jitter"
		record(h, err)
	}

	for _, n := range cfg.fanout {
		logf("fan-out to %d followers (%d rounds)", n, cfg.fanoutRounds)
		for _, s := range systems {
			record(s.fanout(ctx, cfg, n))
		}
		record(etcd.fanout(ctx, cfg, n))
	}

	logf("writes per heartbeat interval (%d intervals of %v)", cfg.intervals, cfg.timing.HeartbeatInterval)
	for _, s := range systems {
		row, err := s.writes(ctx, cfg)
		rep.addWrites(row, err)
	}
	row, err := etcd.writes(ctx, cfg)
	rep.addWrites(row, err)

	// Crash failover is timer-bound (hundreds of milliseconds per sample),
	// so the systems run side by side rather than one after the other.
	logf("crash failover (%d samples each, systems side by side; about 1.5 s per sample)", cfg.crashSamples)
	runs := []func() (series, error){}
	for _, s := range systems {
		runs = append(runs, func() (series, error) { return s.crash(ctx, cfg, cfg.timing, "crash") })
	}
	// The timing the library derives from the bound (heartbeat.TimingFor),
	// on every system: it aims at a fast typical failover and keeps half
	// the bound for the claim.
	derived, err := heartbeat.TimingFor(cfg.bound())
	if err != nil {
		return err
	}
	for _, s := range systems {
		runs = append(runs, func() (series, error) { return s.crash(ctx, cfg, derived, "crash-derived") })
	}
	if cfg.strict {
		s := mainSystem(systems)
		t := cfg.timing
		t.ElectionTimeoutMin, t.LeaseDuration = t.ElectionTimeoutMax, 0
		runs = append(runs, func() (series, error) { return s.crash(ctx, cfg, t.WithDefaults(), "crash-strict") })
	}
	runs = append(runs, func() (series, error) { return etcd.crash(ctx, cfg) })
	results := make([]struct {
		s   series
		err error
	}, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() { results[i].s, results[i].err = r() })
	}
	wg.Wait()
	for _, r := range results {
		record(r.s, r.err)
	}
	return ctx.Err()
}
