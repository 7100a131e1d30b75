package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
//	E <mono> <i>           it believes it leads election i from mono on
//	U <mono> <i> <reason>  it stops believing so at mono
//	S <mono> <i>           it starts to resign election i (on "resign i")
//	C <n>                  statements it has sent so far (on "count")
//
// and reads commands on stdin: "resign <i>", "count". At the end of stdin
// it stops (resigning what it leads) and exits.
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
func (o *nodeOut) unelected(i int, mono int64, reason string) {
	o.printf("U %d %d %s", mono, i, reason)
}

// stmtCounter is a pgx tracer that counts the statements a node sends
// (queries and the statements of batches).
type stmtCounter struct{ n atomic.Int64 }

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

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
	debug     bool
	presence  time.Duration
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
	fs.BoolVar(&nf.debug, "debug", false, "leaderfeed: report failed and slow renewals and failed claims on stderr")
	fs.BoolVar(&nf.noBatch, "nobatch", false, "leaderfeed with -elections > 1: one write statement per election (ElectionsOptions.NoBatch) instead of batches")
	if err := fs.Parse(args); err != nil {
		return err
	}
	url := os.Getenv(nodeURLEnv)
	switch {
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
	el.stop()
	return nil
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
	pcfg.MaxConns = 4
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
	n := &lfNodeElector{out: out, pool: pool}
	// Many elections in one process share a Store through base.Elections
	// (one LISTEN connection, renewals batched), as the README advises; one
	// election is a plain Feed on its own Backend.
	if nf.elections > 1 {
		st, err := postgres.NewStore(pool, pgOptions)
		if err == nil {
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
				f, err = base.New(b, nf.id, base.Options{Timing: tm, Participate: nf.presence > 0, PresenceInterval: nf.presence})
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

func (n *lfNodeElector) resign(i int) {
	n.out.printf("S %d %d", monotonic(), i)
	_ = n.feeds[i].Resign(context.Background())
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
