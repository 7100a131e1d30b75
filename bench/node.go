package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/postgres"
)

// The node subcommand (bench node ...) is one elector node as a process of
// its own, so that the comparison can kill -9 it and cut its connections.
// The parent gives the server URL in nodeURLEnv (not on the command line,
// where the password would show in the process list).
//
// It reports on stdout, one line each, stamped with CLOCK_MONOTONIC:
//
//	R                      ready (connected, campaigning)
//	P                      it participates: a leaderfeed node with
//	                       -participate or -presence once its own
//	                       Participants lists it (a fresh read of the
//	                       store), without them right after R; the
//	                       advisory lock and the lease once they have
//	                       tried for (election 0's) lock or lease once
//	E <mono> <i>           it believes it leads election i from mono on
//	U <mono> <i> <reason>  it stops believing so at mono
//	S <mono> <i>           it starts to resign election i (on "resign i")
//	C <n>                  statements it has sent so far (on "count")
//
// and reads commands on stdin: "resign <i>", "count". At the end of stdin,
// or on SIGTERM (a rolling restart's stop), it stops as a service would
// (leaderfeed: Stop, which hands over to a participant; the advisory
// lock: unlock; the lease: delete its row) and exits.
const nodeURLEnv = "LEADERFEED_BENCH_NODE_URL"

// Elector kinds of the comparison.
const (
	kindLeaderfeed = "leaderfeed"
	kindAdvisory   = "advisory-lock"
	kindLease      = "polling-lease"
	// kindEtcd is etcd's concurrency.Election, every election of the
	// process on one session (many.go); nodeURLEnv is the etcd endpoint.
	kindEtcd = "etcd"
)

var electorKinds = []string{kindLeaderfeed, kindAdvisory, kindLease}

// nodeOut prints the node's report lines; os.Stdout is unbuffered, so a
// line is out before a SIGKILL can lose it.
type nodeOut struct{ mu sync.Mutex }

func (o *nodeOut) printf(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func (o *nodeOut) elected(i int, mono int64) { o.printf("E %d %d", mono, i) }

// resigning reports, at mono+reportDelay, that the node started to resign
// election i at mono. An elector whose resign returns within a few
// milliseconds calls it once the resign returned: the timer, the write to
// the pipe and the bench process it wakes then fall outside the handover
// the stamp begins (arming a timer may wake another thread of the
// process).
func (o *nodeOut) resigning(i int, mono int64) {
	time.AfterFunc(time.Duration(mono+int64(reportDelay)-monotonic()), func() { o.printf("S %d %d", mono, i) })
}

// reportDelay is how long after a resign starts its S line is written:
// longer than a leaderfeed handover, much shorter than the pauses between
// two (the bench takes the S and E lines of a handover in either order).
const reportDelay = 20 * time.Millisecond

func (o *nodeOut) unelected(i int, mono int64, reason string) {
	o.printf("U %d %d %s", mono, i, reason)
}

// stmtCounter is a pgx tracer that counts the statements a node sends
// (queries and the statements of batches).
type stmtCounter struct {
	n   atomic.Int64
	dur atomic.Int64 // nanoseconds the queries took, start to end
}

type queryStart struct{}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return context.WithValue(ctx, queryStart{}, time.Now())
}

func (c *stmtCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if t, ok := ctx.Value(queryStart{}).(time.Time); ok {
		c.dur.Add(int64(time.Since(t)))
	}
}

// The statements of a batch (base.Elections renews many elections in one)
// count one each, as pg_stat_statements counts them.

func (c *stmtCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *stmtCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
}

func (c *stmtCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// nodeElector is what the three kinds of node have in common.
type nodeElector interface {
	resign(i int)
	stop()
}

type nodeFlags struct {
	kind      string
	election  string
	elections int
	id        string
	bound     time.Duration
	hb, emin  time.Duration
	lease     time.Duration
	advRetry  time.Duration
	noBatch   bool
	conns     int32
	debug     bool
	presence  time.Duration
	// participate: leaderfeed nodes participate (Options.Participate)
	// with PresenceInterval -presence, or its default when that is 0.
	participate bool
}

func nodeMain(args []string) error {
	var nf nodeFlags
	fs := flag.NewFlagSet("bench node", flag.ContinueOnError)
	fs.StringVar(&nf.kind, "kind", "", "elector: "+strings.Join(electorKinds, ", "))
	fs.StringVar(&nf.election, "election", "", "election name (with -elections > 1, the prefix of <name>-<i>)")
	fs.IntVar(&nf.elections, "elections", 1, "elections to campaign in")
	fs.StringVar(&nf.id, "id", "", "node id")
	fs.DurationVar(&nf.bound, "bound", time.Second, "dead-leader bound: leaderfeed's ElectionTimeoutMax, the lease's TTL")
	fs.DurationVar(&nf.hb, "heartbeat", 250*time.Millisecond, "leaderfeed: HeartbeatInterval")
	fs.DurationVar(&nf.emin, "emin", 500*time.Millisecond, "leaderfeed: ElectionTimeoutMin")
	fs.DurationVar(&nf.lease, "lease", 0, "leaderfeed: LeaseDuration (default: derived, heartbeat + (emin - heartbeat) / 2)")
	fs.DurationVar(&nf.advRetry, "adv-retry", time.Second, "advisory lock: retry (and session check) period")
	fs.DurationVar(&nf.presence, "presence", 0, "leaderfeed: participate, with this PresenceInterval (0: do not), so that a Resign hands over in one write")
	fs.BoolVar(&nf.participate, "participate", false, "leaderfeed: participate (Options.Participate), with PresenceInterval -presence or, when that is 0, its default")
	fs.BoolVar(&nf.debug, "debug", false, "leaderfeed: report failed and slow renewals and failed claims on stderr, the pool's acquires and statements every second, and (one election) the engine's log at debug level")
	conns := fs.Int("conns", 4, "leaderfeed and polling-lease: the pool's MaxConns")
	fs.BoolVar(&nf.noBatch, "nobatch", false, "leaderfeed with -elections > 1: one write statement per election (ElectionsOptions.NoBatch) instead of batches")
	if err := fs.Parse(args); err != nil {
		return err
	}
	nf.conns = int32(*conns)
	url := os.Getenv(nodeURLEnv)
	switch {
	case nf.conns < 1:
		return errors.New("node: -conns must be at least 1")
	case url == "":
		return errors.New("node: " + nodeURLEnv + " is not set")
	case nf.id == "" || nf.election == "":
		return errors.New("node: -id and -election are required")
	case nf.elections < 1:
		return errors.New("node: -elections must be at least 1")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &nodeOut{}
	counter := &stmtCounter{}
	var (
		el  nodeElector
		err error
	)
	switch nf.kind {
	case kindLeaderfeed:
		el, err = startLFNode(ctx, url, nf, out, counter)
	case kindAdvisory:
		el, err = startAdvisoryNode(ctx, url, nf, out, counter)
	case kindLease:
		el, err = startLeaseNode(ctx, url, nf, out, counter)
	case kindEtcd:
		el, err = startEtcdNode(ctx, url, nf, out)
	default:
		return fmt.Errorf("node: unknown -kind %q (want one of %s)", nf.kind, strings.Join(electorKinds, ", "))
	}
	if err != nil {
		return err
	}
	out.printf("R")
	if p, ok := el.(participant); ok {
		go func() {
			if p.waitParticipating(ctx) == nil {
				out.printf("P")
			}
		}()
	} else {
		out.printf("P")
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	eof := make(chan struct{})
	go func() {
		defer close(eof)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "resign":
				if i, err := strconv.Atoi(f[1]); err == nil && i >= 0 && i < nf.elections {
					el.resign(i)
				}
			case len(f) == 1 && f[0] == "count":
				out.printf("C %d", counter.n.Load())
			}
		}
	}()
	select {
	case <-eof:
	case <-term:
	}
	el.stop()
	return nil
}

// participant is a node that joins the election's participants some time
// after it starts (leaderfeed with -participate).
type participant interface {
	waitParticipating(ctx context.Context) error
}

func electionN(prefix string, i, n int) string {
	if n == 1 {
		return prefix
	}
	return fmt.Sprintf("%s-%d", prefix, i)
}

// ---- leaderfeed ----

type lfNodeElector struct {
	elections *base.Elections // with more than one election
	id        string
	joins     bool // participates: waitParticipating waits for it
	feeds     []*base.Feed
	out       *nodeOut
	pool      *pgxpool.Pool
	wg        sync.WaitGroup
}

func startLFNode(ctx context.Context, url string, nf nodeFlags, out *nodeOut, counter *stmtCounter) (*lfNodeElector, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = nf.conns
	pcfg.ConnConfig.Tracer = counter
	// Every connection of the process, the LISTEN one too, carries its
	// name, so that pg_stat_activity tells the processes apart.
	pcfg.ConnConfig.RuntimeParams["application_name"] = appName(nf.election, nf.id)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	tm := heartbeat.Timing{HeartbeatInterval: nf.hb, ElectionTimeoutMin: nf.emin, ElectionTimeoutMax: nf.bound, LeaseDuration: nf.lease}.WithDefaults()
	if err := tm.Validate(); err != nil {
		return nil, err
	}
	clock := newMonoClock()
	n := &lfNodeElector{out: out, pool: pool, id: nf.id, joins: nf.elections == 1 && (nf.participate || nf.presence > 0)}
	// Many elections in one process share a Store through base.Elections
	// (one LISTEN connection, renewals batched), as the README advises; one
	// election is a plain Feed on its own Backend.
	if nf.elections > 1 {
		st, err := postgres.NewStore(pool, pgOptions)
		if err == nil {
			//lint:ignore SA1019 the benchmark measures the unbatched mode it deprecates
			n.elections, err = base.NewElections(st, base.ElectionsOptions{NoBatch: nf.noBatch})
		}
		if err != nil {
			pool.Close()
			return nil, err
		}
	}
	// With -debug, failed renewals and claims go to stderr.
	var trace *base.Trace
	if nf.debug {
		go debugPool(ctx, nf.id, pool, counter)
		trace = &base.Trace{
			RenewDone: func(ri base.RenewInfo) {
				if ri.Err != nil || ri.Latency > tm.LeaseDuration-tm.HeartbeatInterval {
					fmt.Fprintf(os.Stderr, "bench node %s: renewal of term %d: %v after %v\n", nf.id, ri.Term, ri.Err, ri.Latency)
				}
			},
			ClaimDone: func(ci base.ClaimInfo) {
				if ci.Err != nil && !errors.Is(ci.Err, backend.ErrConflict) {
					fmt.Fprintf(os.Stderr, "bench node %s: claim of term %d: %v after %v\n", nf.id, ci.Term, ci.Err, ci.Latency)
				}
			},
		}
	}
	for i := range nf.elections {
		name := electionN(nf.election, i, nf.elections)
		var f *base.Feed
		if n.elections != nil {
			f, err = n.elections.Feed(name, nf.id, base.Options{Timing: tm, Trace: trace})
		} else {
			var b backend.Election
			if b, err = postgres.New(pool, name, pgOptions); err == nil {
				f, err = base.New(b, nf.id, base.Options{Timing: tm, Participate: nf.participate || nf.presence > 0, PresenceInterval: nf.presence, Logger: nodeLogger(nf)})
			}
		}
		if err != nil {
			n.stop()
			return nil, err
		}
		events := f.Events()
		n.wg.Go(func() {
			for e := range events {
				switch e.Type {
				case base.EventElected:
					out.elected(i, clock.mono(e.At))
				case base.EventUnelected:
					out.unelected(i, clock.mono(e.At), e.Reason.String())
				}
			}
		})
		if err := f.Start(ctx); err != nil {
			_ = f.Stop(context.Background())
			n.stop()
			return nil, err
		}
		n.feeds = append(n.feeds, f)
	}
	return n, nil
}

// waitParticipating returns once the node's own read of the participants
// of its (first) election lists it; at once when it does not participate.
func (n *lfNodeElector) waitParticipating(ctx context.Context) error {
	for n.joins {
		ps, err := n.feeds[0].Participants(ctx)
		if err == nil && slices.ContainsFunc(ps, func(p backend.Presence) bool { return p.Node == n.id }) {
			return nil
		}
		if err := sleep(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func (n *lfNodeElector) resign(i int) {
	start := monotonic()
	_ = n.feeds[i].Resign(context.Background())
	n.out.resigning(i, start)
}

func (n *lfNodeElector) stop() {
	var wg sync.WaitGroup
	for _, f := range n.feeds {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_ = f.Stop(ctx)
		})
	}
	wg.Wait()
	n.wg.Wait()
	if n.elections != nil {
		_ = n.elections.Close()
	}
	n.pool.Close()
}

// appName is the application_name of a leaderfeed node's connections.
func appName(election, id string) string {
	name := election + "/" + id
	if len(name) > 63 {
		name = name[len(name)-63:]
	}
	return name
}

// lockKey is the advisory lock key of an election.
func lockKey(election string) int64 {
	h := fnv.New64a()
	h.Write([]byte(election))
	return int64(h.Sum64())
}

// debugPool reports, every second on stderr, the pool's acquires and the
// statements' latency (-debug).
func debugPool(ctx context.Context, id string, pool *pgxpool.Pool, c *stmtCounter) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last *pgxpool.Stat
	var n0 int64
	var d0 time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := pool.Stat()
		n, d := c.n.Load(), time.Duration(c.dur.Load())
		if last != nil {
			acq := st.AcquireCount() - last.AcquireCount()
			wait := st.AcquireDuration() - last.AcquireDuration()
			empty := st.EmptyAcquireCount() - last.EmptyAcquireCount()
			var meanWait, meanStmt time.Duration
			if acq > 0 {
				meanWait = wait / time.Duration(acq)
			}
			if n > n0 {
				meanStmt = (d - d0) / time.Duration(n-n0)
			}
			fmt.Fprintf(os.Stderr, "bench node %s: pool: %d acquires/s (%d waited, mean wait %v), %d acquired of %d, canceled %d, %d new connections; %d statements/s, mean %v\n",
				id, acq, empty, meanWait, st.AcquiredConns(), st.MaxConns(), st.CanceledAcquireCount()-last.CanceledAcquireCount(), st.NewConnsCount()-last.NewConnsCount(), n-n0, meanStmt)
		}
		last, n0, d0 = st, n, d
	}
}

// nodeLogger is the engine's logger of a node: at debug level on stderr
// with -debug, else none.
func nodeLogger(nf nodeFlags) *slog.Logger {
	if !nf.debug {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", nf.id)
}
