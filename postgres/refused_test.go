package postgres

// Tests of how the Store sorts the server's errors: refusals that retrying
// cannot fix (base.ErrRefused, with the cause and the fix) from transient
// failures, against the real server with real roles.

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// rolePool creates a login role with the grants given (statements with
// %s for the role), and returns a pool that connects as it. The role is
// dropped at cleanup.
func rolePool(t *testing.T, admin *pgxpool.Pool, grants ...string) *pgxpool.Pool {
	t.Helper()
	role := uniqueName(t)
	quoted := pgx.Identifier{role}.Sanitize()
	mustExec(t, admin, "CREATE ROLE "+quoted+" LOGIN PASSWORD 'pw'")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = admin.Exec(ctx, "DROP OWNED BY "+quoted)
		_, _ = admin.Exec(ctx, "DROP ROLE "+quoted)
	})
	for _, g := range grants {
		mustExec(t, admin, strings.ReplaceAll(g, "%s", quoted))
	}
	return poolAs(t, role, "pw", "")
}

// poolAs returns a pool on the test server as user with password, on
// database db ("" for the URL's).
func poolAs(t *testing.T, user, password, db string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = user, password
	if db != "" {
		cfg.ConnConfig.Database = db
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// wantRefused fails unless err matches base.ErrRefused and names each of
// words (the cause and the fix).
func wantRefused(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if !errors.Is(err, base.ErrRefused) {
		t.Fatalf("%s: %v, want an error matching base.ErrRefused", what, err)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %q does not name %q", what, err, w)
		}
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	admin := newPool(t)
	ctx := ctxT(t)
	table := uniqueName(t)
	quoted := pgx.Identifier{"public", table}.Sanitize()
	open(t, admin, "e", Options{Table: table}) // makes the table
	claim := heartbeat.Record{Election: "e", Leader: "a", Term: 1, Lease: time.Second}
	grant := "GRANT SELECT, INSERT, UPDATE, DELETE ON " + quoted + " TO "

	t.Run("no privilege on an existing table", func(t *testing.T) {
		pool := rolePool(t, admin)
		b, err := New(pool, "e", Options{Table: table, NoCreate: true})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.Start(ctx); err != nil {
			t.Fatalf("Start: %v", err)
		}
		// The table exists: the role cannot read it. Not "does not exist".
		err = b.Create(ctx)
		wantRefused(t, "Create", err, "exists, but this role has no SELECT privilege", grant)
		if strings.Contains(err.Error(), "does not exist") || errors.Is(err, base.ErrInvalidConfig) {
			t.Fatalf("Create: %v, calls an existing table missing", err)
		}
		_, err = b.Get(ctx)
		wantRefused(t, "Get", err, "permission denied for table "+table, "SQLSTATE 42501", grant)
		_, err = b.Heartbeat(ctx, heartbeat.Record{}, claim)
		wantRefused(t, "Heartbeat", err, "permission denied for table "+table, grant)
	})

	t.Run("a table without the key index, Create by a role that may write it but does not own it", func(t *testing.T) {
		// A table of an earlier version: what Create made, but the key index.
		table := uniqueName(t)
		quoted := pgx.Identifier{"public", table}.Sanitize()
		open(t, admin, "e", Options{Table: table})
		var index string
		if err := admin.QueryRow(ctx, "SELECT i.indexrelid::regclass::text FROM pg_index i WHERE i.indrelid = to_regclass($1) AND NOT i.indisprimary", quoted).Scan(&index); err != nil {
			t.Fatal(err)
		}
		mustExec(t, admin, "DROP INDEX "+index)
		pool := rolePool(t, admin, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+quoted+" TO %s")
		var logs strings.Builder // Create logs on its caller's goroutine
		s, err := NewStore(pool, Options{Table: table, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Create(ctx); err != nil {
			t.Fatalf("Create: %v; want it to go on without the key index (reads are right without it)", err)
		}
		if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "does not own") || !strings.Contains(l, "CREATE INDEX ON ") {
			t.Fatalf("Create's log: %q, want a warning with the statement for the owner", l)
		}
		if _, err := s.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Election: "f", Leader: "a", Term: 1, Lease: time.Second}); err != nil {
			t.Fatalf("a claim without the key index: %v", err)
		}
		open(t, admin, "e", Options{Table: table}) // the owner's Create makes it
		var exists bool
		if err := admin.QueryRow(ctx, "SELECT "+keyIndexExists("$1::text"), quoted).Scan(&exists); err != nil || !exists {
			t.Fatalf("the key index after the owner's Create: %v, %v", exists, err)
		}
	})

	t.Run("SELECT only", func(t *testing.T) {
		pool := rolePool(t, admin, "GRANT SELECT ON "+quoted+" TO %s")
		b := open(t, pool, "e", Options{Table: table, NoCreate: true}) // an observer needs no more
		if _, err := b.Get(ctx); !errors.Is(err, backend.ErrNotFound) {
			t.Fatalf("Get: %v, want ErrNotFound", err)
		}
		ch := sub(t, b)
		_, err := b.Heartbeat(ctx, heartbeat.Record{}, claim)
		wantRefused(t, "claim", err, "permission denied for table "+table, grant)
		// The feed is fine: reading is allowed.
		select {
		case n, ok := <-ch:
			t.Fatalf("feed sent %v (open %v) after a refused write", n.Type, ok)
		case <-time.After(50 * time.Millisecond):
		}
		// A renewal (UPDATE) is refused the same way.
		first := hb(t, open(t, admin, "e2", Options{Table: table}), heartbeat.Record{}, "a", 1, nil)
		b2 := open(t, pool, "e2", Options{Table: table, NoCreate: true})
		next := claim
		next.Election, next.Term = "e2", 2
		_, err = b2.Heartbeat(ctx, first, next)
		wantRefused(t, "renew", err, "permission denied for table "+table)
	})

	t.Run("no USAGE on the schema", func(t *testing.T) {
		schema := uniqueName(t)
		t.Cleanup(func() {
			_, _ = admin.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		})
		open(t, admin, "e", Options{Schema: schema, Table: "t"})
		pool := rolePool(t, admin, "GRANT SELECT ON "+pgx.Identifier{schema, "t"}.Sanitize()+" TO %s")
		b, _ := New(pool, "e", Options{Schema: schema, Table: "t", NoCreate: true})
		defer b.Close()
		wantRefused(t, "Create", b.Create(ctx), "no USAGE privilege on schema", "GRANT USAGE ON SCHEMA")
	})

	t.Run("no CREATE on the schema", func(t *testing.T) {
		pool := rolePool(t, admin)
		b, _ := New(pool, "e", Options{Table: uniqueName(t)})
		defer b.Close()
		wantRefused(t, "Create", b.Create(ctx), "permission denied for schema public", "GRANT CREATE ON SCHEMA", "leaderfeed schema")
	})

	t.Run("missing table with NoCreate", func(t *testing.T) {
		b, _ := New(admin, "e", Options{Table: uniqueName(t), NoCreate: true})
		defer b.Close()
		err := b.Create(ctx)
		wantRefused(t, "Create", err, "does not exist", "leaderfeed schema")
		if !errors.Is(err, base.ErrInvalidConfig) {
			t.Fatalf("Create: %v, want ErrInvalidConfig too", err)
		}
	})

	t.Run("wrong password", func(t *testing.T) {
		b, _ := New(poolAs(t, "nobody_"+table, "wrong", ""), "e", Options{Table: table})
		defer b.Close()
		wantRefused(t, "Start", b.Start(ctx), "SQLSTATE 28", "password")
	})

	t.Run("missing database", func(t *testing.T) {
		cfg, _ := pgxpool.ParseConfig(serverURL(t))
		b, _ := New(poolAs(t, cfg.ConnConfig.User, cfg.ConnConfig.Password, "no_such_db"), "e", Options{Table: table})
		defer b.Close()
		wantRefused(t, "Start", b.Start(ctx), "SQLSTATE 3D000", "CREATE DATABASE")
	})

	t.Run("transient failures are not refusals", func(t *testing.T) {
		b, _ := New(admin, "e", Options{Table: table})
		defer b.Close()
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := b.Get(cctx); err == nil || errors.Is(err, base.ErrRefused) {
			t.Fatalf("Get on a cancelled context: %v, want a failure that is not a refusal", err)
		}
		tctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
		defer cancel()
		<-tctx.Done()
		if _, err := b.Heartbeat(tctx, heartbeat.Record{}, claim); err == nil || errors.Is(err, base.ErrRefused) {
			t.Fatalf("Heartbeat past its deadline: %v, want a failure that is not a refusal", err)
		}
	})
}

// lockedBuffer is a log sink the feed writes from its goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// A leader whose write privileges are revoked while it runs steps down at
// the end of its lease, logs the refusal once at Error (not once per
// retry), reports it in Health, and leads again by itself once the
// privileges are granted back (within the Feed's refusal retry, five ElectionTimeoutMax).
func TestRefusalWhileRunning(t *testing.T) {
	t.Parallel()
	admin := newPool(t)
	table := uniqueName(t)
	quoted := pgx.Identifier{"public", table}.Sanitize()
	open(t, admin, "e", Options{Table: table})
	pool := rolePool(t, admin, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+quoted+" TO %s")
	role := pool.Config().ConnConfig.User
	b, err := New(pool, "e", Options{Table: table, NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	var tracedRefusals atomic.Int64 // what a metric sees
	trace := &base.Trace{RenewDone: func(ri base.RenewInfo) {
		if errors.Is(ri.Err, base.ErrRefused) {
			tracedRefusals.Add(1)
		}
	}}
	f, err := base.New(b, "n", base.Options{Timing: feedTiming, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Trace: trace})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Stop(context.Background()) }()
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not %s within %v; health %+v", what, d, f.Health())
			}
		}
	}
	waitFor("leader", wait, f.IsLeader)

	mustExec(t, admin, "REVOKE INSERT, UPDATE ON "+quoted+" FROM "+pgx.Identifier{role}.Sanitize())
	waitFor("stepped down", wait, func() bool { return !f.IsLeader() })
	waitFor("refused", wait, func() bool { return f.Health().Refused != nil })
	err = f.Healthy(0)
	if !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "store refuses") ||
		!strings.Contains(err.Error(), "permission denied for table "+table) {
		t.Fatalf("Healthy: %v, want the refusal naming the permission", err)
	}
	// Renewals retry until the lease ends: several refusals, one line.
	if n := logs.count(`level=ERROR msg="leaderfeed: store refuses"`); n != 1 {
		t.Fatalf("%d Error lines for the refusal, want 1:\n%s", n, logs.b.String())
	}
	if tracedRefusals.Load() == 0 {
		t.Fatal("no refused renewal reached the Trace hook as ErrRefused")
	}

	mustExec(t, admin, "GRANT INSERT, UPDATE ON "+quoted+" TO "+pgx.Identifier{role}.Sanitize())
	waitFor("leader again", 5*feedTiming.WithDefaults().ElectionTimeoutMax+wait, f.IsLeader)
	if err := f.Healthy(0); err != nil {
		t.Fatalf("Healthy after the grant: %v", err)
	}
	if n := logs.count(`msg="leaderfeed: store takes the calls it refused"`); n != 1 {
		t.Fatalf("%d lines saying the refusals ended, want 1", n)
	}
}

// What a server that is not up yet answers is transient, not a refusal:
// base.Feed.Start waits through it. No server is needed.
func TestServerNotUpIsTransient(t *testing.T) {
	s := &Store{}
	for _, err := range []error{
		&pgconn.PgError{Code: "57P03", Message: "the database system is starting up"},                  // cannot_connect_now
		&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, // admin_shutdown
		&pgconn.PgError{Code: "53300", Message: "sorry, too many clients already"},                     // too_many_connections
		&pgconn.PgError{Code: "08006", Message: "connection failure"},                                  // connection_failure
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED},
		&net.DNSError{Err: "no such host", Name: "db", IsNotFound: true},
	} {
		if got := s.wrapErr(context.Background(), "postgres: Start: cannot query the server", err); errors.Is(got, base.ErrRefused) {
			t.Errorf("%v: sorted as a refusal (%v), want transient", err, got)
		}
	}
}
