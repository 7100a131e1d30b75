package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/internal/storewait"
	"github.com/leaderfeed/leaderfeed/postgres"
)

const statusUse = `Usage: leaderfeed status --store URL --election NAME [--json]

Prints the election's record: leader (empty when vacant), term, revision,
value, and the age of the last heartbeat in the store's own clock. It only
reads; an election that never had a leader shows exists: false.

It never creates anything: without the table it fails with exit code 4.

Exit codes: 0 printed; 1 the read failed; 2 usage; 3 store not reached
within --connect-timeout; 4 store refuses (a missing privilege or table).
`

// statusJSON is what status --json prints.
type statusJSON struct {
	Election   string    `json:"election"`
	Exists     bool      `json:"exists"`
	Leader     string    `json:"leader"`
	Term       uint64    `json:"term"`
	Revision   uint64    `json:"revision"`
	Value      string    `json:"value"`
	Timestamp  time.Time `json:"timestamp,omitzero"`
	AgeSeconds float64   `json:"age_seconds"`
}

func statusCommand(args []string, stdout, stderr io.Writer) error {
	c := common{noCreate: true, logLevel: "warn"} // the wait for the store is logged
	fs := newFlagSet("status", statusUse, stdout, stderr)
	c.register(fs)
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return exitf(exitUsage, "unexpected argument %q", fs.Arg(0))
	}
	u, _, err := c.check(true, stderr)
	if err != nil {
		return err
	}
	// --connect-timeout bounds the wait for the store and the read.
	ctx, cancel := context.WithTimeout(context.Background(), c.connectTimeout)
	defer cancel()
	log := c.logger(stderr)
	st, b, err := openBackend(ctx, u, &c, log)
	if err != nil {
		return err
	}
	defer st.close()
	defer b.Close()
	if err := storewait.Retry(ctx, log, nil, b.Start); err != nil {
		return classify(&c, err)
	}
	out := statusJSON{Election: c.election}
	rec, err := b.Get(ctx)
	switch {
	case errors.Is(err, backend.ErrNotFound):
	case errors.Is(err, base.ErrRefused):
		return classify(&c, err)
	case err != nil:
		return fmt.Errorf("read the record: %w", err)
	default:
		now, err := st.now(ctx)
		if err != nil {
			return fmt.Errorf("read the store's clock: %w", err)
		}
		out.Exists, out.Leader, out.Term, out.Revision, out.Value = true, rec.Leader, rec.Term, rec.Revision, string(rec.Value)
		out.Timestamp, out.AgeSeconds = rec.Timestamp, now.Sub(rec.Timestamp).Seconds()
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(out)
	}
	if !out.Exists {
		fmt.Fprintf(stdout, "election: %s\nleader: (none: the election has no record yet)\n", out.Election)
		return nil
	}
	leader := out.Leader
	if leader == "" {
		leader = "(vacant)"
	}
	fmt.Fprintf(stdout, "election: %s\nleader: %s\nterm: %d\nrevision: %d\nvalue: %s\nlast heartbeat: %s (%v ago, store clock)\n",
		out.Election, leader, out.Term, out.Revision, out.Value, out.Timestamp.Format(time.RFC3339Nano),
		time.Duration(out.AgeSeconds*float64(time.Second)).Round(time.Millisecond))
	return nil
}

const watchUse = `Usage: leaderfeed watch --store URL --election NAME [--max-outage D]

Follows the election without campaigning and prints each change of leader
as one JSON line ({"time", "leader", "term", "value"}; leader "" when
vacant), the current one first, until interrupted (SIGINT, SIGTERM).

When the store is lost, a line says so on stderr ("leaderfeed: store
lost"), and another when it is back; watch waits for it, or with
--max-outage D exits 1 once the store has not answered for D.

It never creates anything: without the table it fails with exit code 4.

Exit codes: 0 interrupted; 1 the store lost for longer than --max-outage;
2 usage; 3 store not reached within --connect-timeout; 4 store refuses (a
missing privilege or table).
`

// watchLine is one line of watch.
type watchLine struct {
	Time   time.Time `json:"time"`
	Leader string    `json:"leader"`
	Term   uint64    `json:"term"`
	Value  string    `json:"value"`
}

func watchCommand(args []string, stdout, stderr io.Writer) error {
	c := common{noCreate: true}
	fs := newFlagSet("watch", watchUse, stdout, stderr)
	c.register(fs)
	c.registerLog(fs, "warn")
	c.registerOutage(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return exitf(exitUsage, "unexpected argument %q", fs.Arg(0))
	}
	u, timing, err := c.check(true, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// --connect-timeout bounds the wait for the store, from the
	// connection to Start's last check.
	connectCtx, cancelConnect := context.WithTimeout(ctx, c.connectTimeout)
	defer cancelConnect()
	log := c.logger(stderr)
	st, b, err := openBackend(connectCtx, u, &c, log)
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while connecting
		}
		return err
	}
	defer st.close()
	feed, err := base.New(b, fmt.Sprintf("watch-%d", os.Getpid()), base.Options{Timing: timing, ObserveOnly: true, Logger: log})
	if err != nil {
		_ = b.Close()
		return classify(&c, err)
	}
	sub := feed.Subscribe(ctx)
	outageSub := feed.Subscribe(ctx)
	err = feed.Start(connectCtx) // waits for the store, as openBackend does
	cancelConnect()
	if err != nil {
		_ = feed.Stop(context.Background())
		if ctx.Err() != nil {
			return nil
		}
		return classify(&c, err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), timing.WithDefaults().ElectionTimeoutMax)
		defer cancel()
		_ = feed.Stop(sctx)
	}()
	// An outage longer than --max-outage ends watch with exit code 1.
	outageErr := make(chan error, 1)
	outageCtx, stopOutages := context.WithCancel(ctx)
	outagesDone := make(chan struct{})
	go func() {
		defer close(outagesDone)
		newOutages(feed, log, timing, c.maxOutage).run(outageCtx, outageSub, func(err error) { outageErr <- err })
	}()
	defer func() { stopOutages(); <-outagesDone }()
	enc := json.NewEncoder(stdout)
	for {
		select {
		case err := <-outageErr:
			return &exitError{exitFailure, fmt.Errorf("store %s: %w", redact(c.store), err)}
		case e, ok := <-sub.C:
			switch {
			case !ok:
				return sub.Err()
			case (e.Type == base.EventError || e.Type == base.EventSubscribeError) && errors.Is(e.Err, base.ErrRefused):
				return classify(&c, e.Err) // retrying cannot fix it
			case e.Type == base.EventNewLeader:
				if err := enc.Encode(watchLine{Time: e.At, Leader: e.Leader, Term: e.Term, Value: string(e.Value)}); err != nil {
					return fmt.Errorf("write: %w", err)
				}
			}
		}
	}
}

const schemaUse = `Usage: leaderfeed schema --store postgres://... [--schema S] [--table T]

Prints the SQL that creates what the postgres backend needs (schema,
election table, trigger functions, triggers), for an administrator to run
when the application may not create tables (run it with --no-create). It
does not connect. MongoDB and RethinkDB need no script.

Exit codes: 0 printed; 2 usage (not a postgres URL, bad names).
`

func schemaCommand(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("schema", schemaUse, stdout, stderr)
	var store, storeFile string
	registerStore(fs, &store, &storeFile)
	schema := fs.String("schema", "", "schema of the table; default public")
	table := fs.String("table", "", "election table; default leaderfeed")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return exitf(exitUsage, "unexpected argument %q", fs.Arg(0))
	}
	raw, err := resolveStore(store, storeFile, stderr)
	if err != nil {
		return err
	}
	u, err := parseStore(raw)
	if err != nil {
		return &exitError{exitUsage, err}
	}
	if u.kind != kindPostgres {
		return exitf(exitUsage, "only the postgres backend needs a script (%s creates its %s itself, or checks it with --no-create)", u.kind,
			map[storeKind]string{kindMongo: "collection", kindRethink: "database and table"}[u.kind])
	}
	sql, err := postgres.SchemaSQL(postgres.Options{Schema: *schema, Table: *table})
	if err != nil {
		return &exitError{exitUsage, err}
	}
	_, err = fmt.Fprintln(stdout, sql)
	return err
}
