//go:build linux

// Command node is one leaderfeed node for the integration tests: one Feed
// on a chosen backend and election, as a process of its own. It prints
// every transition to stdout as a line integration.ParseLine reads, stamped
// with the machine's monotonic clock so that the logs of several processes
// can be compared. While it leads, a job ticks every -act and notes when it
// found the term's leader context live; when the term ends it prints that as
// one "act" line. SIGTERM or SIGINT stops the Feed (it resigns if it leads)
// and ends the process; SIGUSR1 makes it Resign. With -presence it
// participates, so that a leader hands over in one write.
//
//	LEADERFEED_NODE_URL=postgres://... node -backend postgres -election e -id n1
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"sync"
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
		presence = flag.Duration("presence", 0, "participate with this PresenceInterval (0: do not)")
	)
	flag.Parse()
	if err := run(*backend, *addr, *db, *election, *id, *every, *presence, heartbeat.Timing{
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

func run(backend, addr, db, election, id string, every, presence time.Duration, timing heartbeat.Timing) error {
	if id == "" {
		return errors.New("-id is required")
	}
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	out := &printer{clock: integration.NewClock(), node: id}

	b, closeClient, err := open(sigCtx, backend, addr, db, election, id)
	if err != nil {
		return err
	}
	defer closeClient()
	feed, err := base.New(b, id, base.Options{Timing: timing, Value: []byte(id), Participate: presence > 0, PresenceInterval: presence})
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

	var jobs sync.WaitGroup
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

// open connects to the server and returns the backend, and a function that
// closes the client once the Feed (which closes the backend) has stopped.
func open(ctx context.Context, backend, addr, db, election, id string) (backend.Election, func(), error) {
	switch backend {
	case "postgres":
		cfg, err := pgxpool.ParseConfig(addr)
		if err != nil {
			return nil, nil, err
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
			return nil, nil, err
		}
		b, err := postgres.New(pool, election, postgres.Options{})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return b, pool.Close, nil
	case "mongo":
		u, err := url.Parse(addr)
		if err != nil {
			return nil, nil, err
		}
		q := u.Query()
		q.Set("directConnection", "true") // through the proxy, not to the hosts the server names
		u.RawQuery = q.Encode()
		client, err := mongodrv.Connect(mongoopts.Client().ApplyURI(u.String()).
			SetServerSelectionTimeout(2 * time.Second).SetConnectTimeout(time.Second))
		if err != nil {
			return nil, nil, err
		}
		b, err := mongo.New(client.Database(db), election, mongo.Options{})
		if err != nil {
			_ = client.Disconnect(context.Background())
			return nil, nil, err
		}
		return b, func() { _ = client.Disconnect(context.Background()) }, nil
	case "rethink":
		session, err := r.Connect(r.ConnectOpts{Address: addr, Timeout: time.Second})
		if err != nil {
			return nil, nil, err
		}
		b, err := rethink.New(session, election, rethink.Options{Database: db})
		if err != nil {
			_ = session.Close()
			return nil, nil, err
		}
		return b, func() { _ = session.Close() }, nil
	}
	return nil, nil, fmt.Errorf("unknown backend %q", backend)
}
