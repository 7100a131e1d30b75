//go:build linux

// Command node is one leaderfeed node for the integration tests: one Feed
// on a chosen backend and election, as a process of its own. It prints
// every transition to stdout as a line integration.ParseLine reads, stamped
// with the machine's monotonic clock so that the logs of several processes
// can be compared. While it leads, a job ticks every -act and notes when it
// found the term's leader context live; when the term ends it prints that as
// one "act" line. SIGTERM or SIGINT stops the Feed (it resigns if it leads)
// and ends the process; SIGUSR1 makes it Resign. With -presence or
// -participate it participates, so that a leader hands over in one write
// (-participate alone: the default PresenceInterval). Durations of 0 mean
// the library's defaults (-heartbeat 0 -emin 0 -emax 0: its default
// timing). With -fence (on
// PostgreSQL) the leader also runs fenced transactions while it leads
// (postgres.Fence, then integration.FenceWriteSQL), about one every
// -fence, and prints what came of them as one "fence" line per term.
//
//	LEADERFEED_NODE_URL=postgres://... node -backend postgres -election e -id n1
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	mongodrv "go.mongodb.org/mongo-driver/v2/mongo"
	mongoopts "go.mongodb.org/mongo-driver/v2/mongo/options"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/integration"
	"github.com/leaderfeed/leaderfeed/mongo"
	"github.com/leaderfeed/leaderfeed/postgres"
	"github.com/leaderfeed/leaderfeed/rethink"
)

func main() {
	var (
		backend  = flag.String("backend", "postgres", "postgres, mongo or rethink")
		addr     = flag.String("url", os.Getenv("LEADERFEED_NODE_URL"), "server: a PostgreSQL or MongoDB URL, or a RethinkDB host:port (default $LEADERFEED_NODE_URL, which keeps a password out of the process list)")
		db       = flag.String("db", "leaderfeed_it", "database (MongoDB, RethinkDB)")
		election = flag.String("election", "integration", "election name")
		id       = flag.String("id", "", "node id")
		hb       = flag.Duration("heartbeat", 50*time.Millisecond, "heartbeat interval")
		emin     = flag.Duration("emin", 250*time.Millisecond, "election timeout min")
		emax     = flag.Duration("emax", 500*time.Millisecond, "election timeout max")
		every    = flag.Duration("act", time.Millisecond, "how often the leader's job checks its leader context")
		presence = flag.Duration("presence", 0, "participate with this PresenceInterval (0: do not, unless -participate)")
		partic   = flag.Bool("participate", false, "participate, with the PresenceInterval of -presence or else the default")
		fence    = flag.Duration("fence", 0, "while leading, run a fenced transaction about this often (postgres only; 0: none)")
	)
	flag.Parse()
	if err := run(*backend, *addr, *db, *election, *id, *every, *presence, *partic, *fence, heartbeat.Timing{
		HeartbeatInterval:  *hb,
		ElectionTimeoutMin: *emin,
		ElectionTimeoutMax: *emax,
	}); err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(1)
	}
}

type printer struct {
	mu    sync.Mutex
	clock *integration.Clock
	node  string
}

func (p *printer) print(l integration.Line) {
	l.Node = p.node
	p.mu.Lock()
	defer p.mu.Unlock()
	// os.Stdout is unbuffered: a line is out before a SIGKILL can lose it.
	fmt.Fprintln(os.Stdout, l.String())
}

func run(backend, addr, db, election, id string, every, presence time.Duration, participate bool, fence time.Duration, timing heartbeat.Timing) error {
	if id == "" {
		return errors.New("-id is required")
	}
	if fence > 0 && backend != "postgres" {
		return errors.New("-fence needs -backend postgres")
	}
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	out := &printer{clock: integration.NewClock(), node: id}

	b, pool, closeClient, err := open(sigCtx, backend, addr, db, election, id)
	if err != nil {
		return err
	}
	defer closeClient()
	feed, err := base.New(b, id, base.Options{Timing: timing, Value: []byte(id), Participate: participate || presence > 0, PresenceInterval: presence})
	if err != nil {
		return err
	}
	events := feed.Events()
	for {
		ctx, cancel := context.WithTimeout(sigCtx, 2*time.Second)
		err = feed.Start(ctx)
		cancel()
		if err == nil {
			break
		}
		fmt.Fprintln(os.Stderr, "node: start:", err)
		select {
		case <-sigCtx.Done():
			return feed.Stop(context.Background())
		case <-time.After(100 * time.Millisecond):
		}
	}
	out.print(integration.Line{Mono: integration.Monotonic(), Kind: integration.KindStart})

	resign := make(chan os.Signal, 1)
	signal.Notify(resign, syscall.SIGUSR1)
	defer signal.Stop(resign)
	go func() {
		for {
			select {
			case <-resign:
				ctx, cancel := context.WithTimeout(sigCtx, 2*time.Second)
				if err := feed.Resign(ctx); err != nil {
					fmt.Fprintln(os.Stderr, "node: resign:", err)
				}
				cancel()
			case <-sigCtx.Done():
				return
			}
		}
	}()

	stopped := make(chan error, 1)
	go func() {
		<-sigCtx.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stopped <- feed.Stop(ctx)
	}()

	var (
		jobs sync.WaitGroup
		seq  atomic.Int64 // of this process's fenced writes
	)
	for e := range events {
		l := integration.Line{Mono: out.clock.Mono(e.At), Term: e.Term}
		switch e.Type {
		case base.EventElected:
			l.Kind = integration.KindElected
			jobs.Add(1)
			go func() {
				defer jobs.Done()
				job(out, e.LeaderCtx, e.Term, every)
			}()
			if fence > 0 {
				jobs.Add(1)
				go func() {
					defer jobs.Done()
					fenced(out, e.LeaderCtx, pool, election, id, e.Term, fence, &seq)
				}()
			}
		case base.EventUnelected:
			l.Kind, l.Reason = integration.KindUnelected, e.Reason.String()
		case base.EventNewLeader:
			l.Kind, l.Leader = integration.KindNewLeader, e.Leader
		case base.EventSubscribeStarted:
			l.Kind = integration.KindSubStarted
		case base.EventSubscribeError:
			l.Kind = integration.KindSubError
		default:
			continue
		}
		out.print(l)
	}
	jobs.Wait()
	err = <-stopped
	out.print(integration.Line{Mono: integration.Monotonic(), Kind: integration.KindExit})
	return err
}

// job stands for the work a leader does under its leader context: every
// tick it reads the clock, then checks the context, and counts the moment
// as acting as leader only if the context was still live after the
// reading. It reports the first and last such moments when the term ends.
func job(out *printer, ctx context.Context, term uint64, every time.Duration) {
	l := integration.Line{Kind: integration.KindAct, Term: term}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		now := integration.Monotonic()
		if ctx.Err() != nil {
			break
		}
		if l.Count == 0 {
			l.First = now
		}
		l.Last = now
		l.Count++
		select {
		case <-ctx.Done():
		case <-t.C:
			continue
		}
		break
	}
	l.Mono = integration.Monotonic()
	out.print(l)
}

// fenced runs fenced transactions while ctx, the leader context of term,
// is live: one every every/2 to 3*every/2. It counts them by outcome
// (cancelled: failed once ctx was done), writes errors other than
// refusals and cancellations to stderr, and prints the counts as a fence
// line when the term ends.
func fenced(out *printer, ctx context.Context, pool *pgxpool.Pool, election, id string, term uint64, every time.Duration, seq *atomic.Int64) {
	l := integration.Line{Kind: integration.KindFence, Term: term}
	for ctx.Err() == nil {
		var hold time.Duration
		if rand.IntN(2) == 0 {
			hold = time.Duration(1+rand.IntN(8)) * time.Millisecond
		}
		err := fencedWrite(ctx, pool, election, id, term, seq.Add(1), hold)
		switch {
		case err == nil:
			l.Count++
		case errors.Is(err, base.ErrFenced):
			l.Refused++
		case ctx.Err() != nil:
			l.Cancelled++
		default:
			l.Errors++
			fmt.Fprintf(os.Stderr, "node: fenced write of term %d: %v\n", term, err)
		}
		t := time.NewTimer(every/2 + rand.N(every))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	l.Mono = integration.Monotonic()
	out.print(l)
}

// fencedWrite runs one fenced transaction of term: postgres.Fence, then
// the write (integration.FenceWriteSQL), then the commit. With hold 0 the
// transaction is bounded by ctx, the leader context. Otherwise it is like
// work that checks once that it leads and then runs unbound by the leader
// context: it holds the lock for hold between the fence and the write
// (time.Sleep), so that a pause of the process (SIGSTOP) can fall inside
// it, and it may wake after its lease with its commit still to send. Only
// the fence then keeps it from committing after the next term began: the
// next leader's claim waits for its lock, and the server ends it once it
// has been idle for a lease (see postgres.Fence). The leader context does
// not: pgx checks it before every statement, so a transaction bounded by
// it does not commit after a pause even without the fence.
func fencedWrite(ctx context.Context, pool *pgxpool.Pool, election, id string, term uint64, seq int64, hold time.Duration) error {
	if hold > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// A no-op after the commit; after a failure ctx may be done.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	if err := postgres.Fence(ctx, tx, postgres.Options{}, election, term); err != nil {
		return err
	}
	time.Sleep(hold)
	if _, err := tx.Exec(ctx, integration.FenceWriteSQL, election, int64(term), id, seq, integration.Monotonic()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// open connects to the server and returns the backend, the pool on
// PostgreSQL (else nil), and a function that closes the client once the
// Feed (which closes the backend) has stopped.
func open(ctx context.Context, backend, addr, db, election, id string) (backend.Election, *pgxpool.Pool, func(), error) {
	switch backend {
	case "postgres":
		cfg, err := pgxpool.ParseConfig(addr)
		if err != nil {
			return nil, nil, nil, err
		}
		// The listener's connection is made from ConnConfig; the pool's own
		// connections pass BeforeConnect. The names let the tests find this
		// node's listener in pg_stat_activity.
		cfg.ConnConfig.RuntimeParams["application_name"] = "lf-" + id + "-listen"
		cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
			cc.RuntimeParams["application_name"] = "lf-" + id + "-pool"
			return nil
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		b, err := postgres.New(pool, election, postgres.Options{})
		if err != nil {
			pool.Close()
			return nil, nil, nil, err
		}
		return b, pool, pool.Close, nil
	case "mongo":
		u, err := url.Parse(addr)
		if err != nil {
			return nil, nil, nil, err
		}
		q := u.Query()
		q.Set("directConnection", "true") // through the proxy, not to the hosts the server names
		u.RawQuery = q.Encode()
		client, err := mongodrv.Connect(mongoopts.Client().ApplyURI(u.String()).
			SetServerSelectionTimeout(2 * time.Second).SetConnectTimeout(time.Second))
		if err != nil {
			return nil, nil, nil, err
		}
		b, err := mongo.New(client.Database(db), election, mongo.Options{})
		if err != nil {
			_ = client.Disconnect(context.Background())
			return nil, nil, nil, err
		}
		return b, nil, func() { _ = client.Disconnect(context.Background()) }, nil
	case "rethink":
		session, err := r.Connect(r.ConnectOpts{Address: addr, Timeout: time.Second})
		if err != nil {
			return nil, nil, nil, err
		}
		b, err := rethink.New(session, election, rethink.Options{Database: db})
		if err != nil {
			_ = session.Close()
			return nil, nil, nil, err
		}
		return b, nil, func() { _ = session.Close() }, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown backend %q", backend)
}
