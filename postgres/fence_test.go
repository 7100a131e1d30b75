package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

func TestFenceRejectsBadArguments(t *testing.T) {
	// Fence checks its arguments before it sends anything: a nil tx is
	// never used.
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		opts     Options
		election string
		term     uint64
	}{
		{"nil tx", Options{}, "e", 1},
		{"empty election", Options{}, "", 1},
		{"election with a control character", Options{}, "e\x01", 1},
		{"election too long", Options{}, strings.Repeat("e", heartbeat.MaxNameLen+1), 1},
		{"term 0", Options{}, "e", 0},
		{"term beyond bigint", Options{}, "e", math.MaxInt64 + 1},
		{"table with a dash", Options{Table: "a-b"}, "e", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Fence(ctx, nil, tc.opts, tc.election, tc.term); !errors.Is(err, base.ErrInvalidConfig) {
				t.Fatalf("Fence: %v, want ErrInvalidConfig", err)
			}
		})
	}
	if _, err := FenceFunction(Options{Table: "a-b"}); !errors.Is(err, base.ErrInvalidConfig) {
		t.Fatalf("FenceFunction with a bad name: %v, want ErrInvalidConfig", err)
	}
}

func TestFenceFunctionName(t *testing.T) {
	// The function is named after the table, in the table's schema: table
	// names are unique in a schema, so every election table of a schema
	// has a fence function of its own, even when they share a channel
	// prefix. Long names keep within PostgreSQL's 63 bytes and apart.
	if f, _ := FenceFunction(Options{}); f != `"public"."leaderfeed_fence"` {
		t.Fatalf("default fence function %s", f)
	}
	if f, _ := FenceFunction(Options{Schema: "app", Table: "elections", ChannelPrefix: "x"}); f != `"app"."elections_fence"` {
		t.Fatalf("fence function %s", f)
	}
	long := strings.Repeat("t", 60)
	names := map[string]string{}
	for _, table := range []string{strings.Repeat("t", 57), long, long + "x", long + "y", long + "_fe", strings.Repeat("t", 63)} {
		n := fenceFuncName(table)
		if len(n) > 63 || !strings.HasSuffix(n, "_fence") {
			t.Errorf("table %q: fence function %q (%d bytes)", table, n, len(n))
		}
		if other, ok := names[n]; ok {
			t.Errorf("tables %q and %q share the fence function %q", other, table, n)
		}
		names[n] = table
	}
}

// fenceTable is an election table with one election led by "a" in term
// 1, and a table of the leader's own data beside it.
type fenceTable struct {
	pool   *pgxpool.Pool
	s      *Store
	opts   Options
	data   string // the quoted data table: (id int, term bigint, at timestamptz)
	leader heartbeat.Record
}

func newFenceTable(t *testing.T, election string, lease time.Duration) *fenceTable {
	t.Helper()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	s := openStore(t, pool, opts)
	ft := &fenceTable{pool: pool, s: s, opts: s.opts, data: pgx.Identifier{opts.Table + "_data"}.Sanitize()}
	mustExec(t, pool, "CREATE TABLE "+ft.data+" (id int PRIMARY KEY, term bigint NOT NULL, at timestamptz NOT NULL)")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+ft.data+", "+s.ddl.table)
		_, _ = pool.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fenceFunc(s.opts)+"(text, bigint)")
	})
	ft.leader = ft.write(t, heartbeat.Record{}, "a", 1, lease)
	return ft
}

// write is a compare-and-set of the record of e.
func (ft *fenceTable) write(t *testing.T, expected heartbeat.Record, leader string, term uint64, lease time.Duration) heartbeat.Record {
	t.Helper()
	r, err := ft.s.Heartbeat(ctxT(t), expected, heartbeat.Record{Election: "e", Leader: leader, Term: term, Lease: lease})
	if err != nil {
		t.Fatalf("Heartbeat(%q, term %d): %v", leader, term, err)
	}
	return r
}

// insert writes a row of the leader's data in tx, stamped with the
// server's clock.
func (ft *fenceTable) insert(t *testing.T, tx pgx.Tx, id int, term uint64) {
	t.Helper()
	if _, err := tx.Exec(ctxT(t), "INSERT INTO "+ft.data+" VALUES ($1, $2, clock_timestamp())", id, int64(term)); err != nil {
		t.Fatalf("insert %d: %v", id, err)
	}
}

// row returns the time the data row id was written, and whether it is
// there (committed).
func (ft *fenceTable) row(t *testing.T, id int) (time.Time, bool) {
	t.Helper()
	var at time.Time
	err := ft.pool.QueryRow(ctxT(t), "SELECT at FROM "+ft.data+" WHERE id = $1", id).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false
	}
	if err != nil {
		t.Fatalf("read row %d: %v", id, err)
	}
	return at, true
}

func (ft *fenceTable) begin(t *testing.T, iso pgx.TxIsoLevel) pgx.Tx {
	t.Helper()
	tx, err := ft.pool.BeginTx(ctxT(t), pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

var isoLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

// wantFenced checks that err matches base.ErrFenced and names what it
// should.
func wantFenced(t *testing.T, what string, err error, words ...string) {
	t.Helper()
	if !errors.Is(err, base.ErrFenced) {
		t.Fatalf("%s: %v, want ErrFenced", what, err)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%s: %v, want it to say %q", what, err, w)
		}
	}
}

func TestFence(t *testing.T) {
	t.Parallel()
	for _, iso := range isoLevels {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			ft := newFenceTable(t, "e", time.Minute)
			ctx := ctxT(t)

			// The current leader's fenced write commits, with the Store's
			// Fence and with the one for a program without a Store.
			tx := ft.begin(t, iso)
			if err := ft.s.Fence(ctx, tx, "e", 1); err != nil {
				t.Fatalf("Store.Fence of the current term: %v", err)
			}
			ft.insert(t, tx, 1, 1)
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("commit: %v", err)
			}
			tx = ft.begin(t, iso)
			ft.insert(t, tx, 2, 1)
			if err := Fence(ctx, tx, ft.opts, "e", 1); err != nil {
				t.Fatalf("Fence of the current term after a write: %v", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("commit: %v", err)
			}
			for _, id := range []int{1, 2} {
				if _, ok := ft.row(t, id); !ok {
					t.Fatalf("row %d of a fenced transaction of the leader did not commit", id)
				}
			}

			// A transaction that began (and wrote) before another node's
			// claim committed: Fence with the old term fails, and nothing
			// of the transaction commits, even if its caller commits.
			tx = ft.begin(t, iso)
			ft.insert(t, tx, 3, 1) // takes the snapshot under REPEATABLE READ and SERIALIZABLE
			b := ft.write(t, ft.leader, "b", 2, time.Minute)
			err := ft.s.Fence(ctx, tx, "e", 1)
			if iso == pgx.ReadCommitted {
				wantFenced(t, "Fence after a claim", err, `"e"`, "term 1 asked", `term 2 found (leader "b")`)
			} else {
				// The row was written after the snapshot: the server
				// cannot lock it in that snapshot.
				wantFenced(t, "Fence after a claim that committed after the snapshot", err, `"e"`, "term 1 asked", "term found unknown")
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
					t.Fatalf("Fence under %s: %v, want it to wrap the serialization failure 40001", iso, err)
				}
			}
			if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
				t.Fatalf("commit after a failed Fence: %v, want pgx.ErrTxCommitRollback", err)
			}
			if _, ok := ft.row(t, 3); ok {
				t.Fatal("the write of a deposed leader's transaction committed")
			}

			// A transaction begun after the claim: the old term is
			// fenced in every isolation level, by the term found.
			tx = ft.begin(t, iso)
			wantFenced(t, "Fence of the old term", Fence(ctx, tx, ft.opts, "e", 1), "term 1 asked", "term 2 found")
			tx = ft.begin(t, iso)
			if err := Fence(ctx, tx, ft.opts, "e", 2); err != nil {
				t.Fatalf("Fence of the new term: %v", err)
			}
			_ = tx.Rollback(ctx)

			// A vacant record and a missing one fence every term.
			ft.write(t, b, "", 2, 0)
			tx = ft.begin(t, iso)
			wantFenced(t, "Fence on a vacant record", ft.s.Fence(ctx, tx, "e", 2), "term 2 asked", "term 2 found with no leader")
			tx = ft.begin(t, iso)
			wantFenced(t, "Fence of a missing record", ft.s.Fence(ctx, tx, "nobody", 2), `"nobody"`, "term 2 asked", "no record found")
		})
	}
}

// A claim sent while a fenced transaction is open waits for it: the
// server shows the claim blocked by the transaction's backend, the record
// is still the leader's just before the transaction commits, and the
// claim commits the next revision after it. (The record's timestamp
// cannot show the order: the UPDATE computes clock_timestamp() before it
// waits for the row's lock; commit timestamps need
// track_commit_timestamp, off by default.)
func TestFenceOrdersClaimAfterTransaction(t *testing.T) {
	t.Parallel()
	for _, iso := range isoLevels {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			ft := newFenceTable(t, "e", time.Minute)
			ctx := ctxT(t)
			tx := ft.begin(t, iso)
			if err := ft.s.Fence(ctx, tx, "e", 1); err != nil {
				t.Fatalf("Fence: %v", err)
			}
			type result struct {
				r    heartbeat.Record
				err  error
				done time.Time
			}
			claimed := make(chan result, 1)
			go func() {
				r, err := ft.s.Heartbeat(ctx, ft.leader, heartbeat.Record{Election: "e", Leader: "b", Term: 2, Lease: time.Minute})
				claimed <- result{r, err, time.Now()}
			}()
			// The server says what the claim waits for.
			pid := tx.Conn().PgConn().PID()
			for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
				var blocked int
				if err := ft.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))",
					int32(pid)).Scan(&blocked); err != nil {
					t.Fatal(err)
				}
				if blocked > 0 {
					break
				}
				select {
				case c := <-claimed:
					t.Fatalf("the claim returned while the fenced transaction was open: %+v, %v", c.r, c.err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("no backend is blocked by the fenced transaction")
				}
			}
			ft.insert(t, tx, 1, 1)
			if cur, err := ft.s.Get(ctx, "e"); err != nil || !cur.Equal(ft.leader) {
				t.Fatalf("the record just before the fenced commit: %+v, %v; want the leader's %+v", cur, err, ft.leader)
			}
			commitSent := time.Now() // the claim may return before Commit does: the server answers both at once
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("commit of the fenced transaction: %v", err)
			}
			var c result
			select {
			case c = <-claimed:
			case <-time.After(wait):
				t.Fatal("the claim did not return after the fenced transaction ended")
			}
			if c.err != nil || c.r.Term != 2 || c.r.Revision != ft.leader.Revision+1 {
				t.Fatalf("claim after the fenced transaction: %+v, %v", c.r, c.err)
			}
			if _, ok := ft.row(t, 1); !ok {
				t.Fatal("the fenced write did not commit")
			}
			if c.done.Before(commitSent) {
				t.Fatalf("the claim returned at %v, before the fenced transaction's commit was sent (%v)", c.done, commitSent)
			}
			t.Logf("revision %d (term 1) until the fenced commit; the claim, blocked by backend %d, wrote revision %d (term 2) after it",
				ft.leader.Revision, pid, c.r.Revision)
		})
	}
}

// A client that stops while its fenced transaction holds the lock (a
// frozen process: its connection stays open) holds up the next claim for
// about a lease, not for as long as it is stopped: Fence bounds the
// transaction's idle time by the leader's lease.
func TestFenceBoundsIdleTransaction(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	ft := newFenceTable(t, "e", lease)
	ctx := ctxT(t)
	tx := ft.begin(t, pgx.ReadCommitted)
	if err := ft.s.Fence(ctx, tx, "e", 1); err != nil {
		t.Fatalf("Fence: %v", err)
	}
	ft.insert(t, tx, 1, 1)
	start := time.Now()
	// The transaction now idles: the claim waits, then goes through when
	// the server ends the idle session.
	r, err := ft.s.Heartbeat(ctx, ft.leader, heartbeat.Record{Election: "e", Leader: "b", Term: 2, Lease: lease})
	took := time.Since(start)
	if err != nil || r.Term != 2 {
		t.Fatalf("claim: %+v, %v", r, err)
	}
	if took < lease/2 || took > wait {
		t.Fatalf("the claim took %v; want about the lease (%v)", took, lease)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the commit of a transaction the server ended succeeded")
	}
	if _, ok := ft.row(t, 1); ok {
		t.Fatal("the write of the ended transaction committed")
	}
	t.Logf("the claim waited %v for the idle fenced transaction (lease %v)", took, lease)
}

// The SQL function, as any language calls it: the same lock and check,
// FencedSQLState with the election, the terms asked and found in the
// message and as JSON in the detail.
func TestFenceFunctionSQL(t *testing.T) {
	t.Parallel()
	ft := newFenceTable(t, "e", time.Minute)
	ctx := ctxT(t)
	fn := fenceFunc(ft.opts)

	tx := ft.begin(t, pgx.ReadCommitted)
	if _, err := tx.Exec(ctx, "SELECT "+fn+"(election => $1, term => $2)", "e", 1); err != nil {
		t.Fatalf("fence function of the current term: %v", err)
	}
	ft.insert(t, tx, 1, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ft.write(t, ft.leader, "b", 2, time.Minute)
	tx = ft.begin(t, pgx.ReadCommitted)
	ft.insert(t, tx, 2, 1)
	_, err := tx.Exec(ctx, "SELECT "+fn+"($1, $2)", "e", 1)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != FencedSQLState {
		t.Fatalf("fence function of the old term: %v, want SQLSTATE %s", err, FencedSQLState)
	}
	if want := `leaderfeed: election "e" is fenced: term 1 asked, term 2 found (leader "b")`; pgErr.Message != want {
		t.Fatalf("message %q, want %q", pgErr.Message, want)
	}
	var detail struct {
		Election     string
		Asked, Found int64
		Leader       string
	}
	if err := json.Unmarshal([]byte(pgErr.Detail), &detail); err != nil || detail.Election != "e" || detail.Asked != 1 || detail.Found != 2 || detail.Leader != "b" {
		t.Fatalf("detail %q: %+v, %v", pgErr.Detail, detail, err)
	}
	_ = tx.Commit(ctx)
	if _, ok := ft.row(t, 2); ok {
		t.Fatal("a write fenced by the SQL function committed")
	}

	// psql, as a CMD of leaderfeed run would call it.
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Log("psql is not on PATH: the psql part is skipped")
		return
	}
	script := `\set ON_ERROR_STOP 1
BEGIN;
SELECT ` + fn + `(:'election', :'term');
INSERT INTO ` + ft.data + ` VALUES (:id, :'term', clock_timestamp());
COMMIT;
`
	run := func(id, term string) (string, error) {
		cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "election=e", "-v", "term="+term, "-v", "id="+id, serverURL(t))
		cmd.Stdin = strings.NewReader(script)
		cmd.Env = append(os.Environ(), "PGAPPNAME=fence_test")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("3", "2"); err != nil {
		t.Fatalf("psql with the current term: %v\n%s", err, out)
	}
	out, err := run("4", "1")
	if err == nil || !strings.Contains(out, `election "e" is fenced: term 1 asked, term 2 found`) {
		t.Fatalf("psql with the old term: %v\n%s", err, out)
	}
	if _, ok := ft.row(t, 3); !ok {
		t.Fatal("psql's fenced write of the current term did not commit")
	}
	if _, ok := ft.row(t, 4); ok {
		t.Fatal("psql's write of the old term committed")
	}
}

// Create makes the fence function and remakes it when it is missing;
// without it (a table of an earlier version under NoCreate) Fence is
// refused with the fix. SchemaSQL makes it too, and may run again.
func TestFenceFunctionCreate(t *testing.T) {
	t.Parallel()
	ft := newFenceTable(t, "e", time.Minute)
	ctx := ctxT(t)
	fn := fenceFunc(ft.opts)
	mustExec(t, ft.pool, "DROP FUNCTION "+fn+"(text, bigint)")
	tx := ft.begin(t, pgx.ReadCommitted)
	err := ft.s.Fence(ctx, tx, "e", 1)
	if !errors.Is(err, base.ErrRefused) || errors.Is(err, base.ErrFenced) || !strings.Contains(err.Error(), "apply SchemaSQL") {
		t.Fatalf("Fence without the function: %v, want ErrRefused naming the fix", err)
	}
	_ = tx.Rollback(ctx)
	for range 2 {
		if err := ft.s.Create(ctx); err != nil {
			t.Fatalf("Create: %v", err)
		}
	}
	tx = ft.begin(t, pgx.ReadCommitted)
	if err := ft.s.Fence(ctx, tx, "e", 1); err != nil {
		t.Fatalf("Fence after Create: %v", err)
	}
	_ = tx.Rollback(ctx)

	script, err := SchemaSQL(ft.opts)
	if err != nil || !strings.Contains(script, "CREATE OR REPLACE FUNCTION "+fn+"(election text, term bigint)") {
		t.Fatalf("SchemaSQL: %v\n%s", err, script)
	}
	mustExec(t, ft.pool, "DROP FUNCTION "+fn+"(text, bigint)")
	for range 2 {
		if _, err := ft.pool.Exec(ctx, script); err != nil {
			t.Fatalf("SchemaSQL's script: %v", err)
		}
	}
	tx = ft.begin(t, pgx.ReadCommitted)
	wantFenced(t, "Fence of an old term after SchemaSQL", ft.s.Fence(ctx, tx, "e", 7), "term 7 asked", "term 1 found")
}

// The engine's leader fences its writes with the term Run hands it; once
// another node took over, the deposed leader's fenced write fails (here
// a leader that has not yet seen its leader context end, as one paused
// past its lease would).
func TestFenceUnderRun(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	data := pgx.Identifier{opts.Table + "_data"}.Sanitize()
	mustExec(t, pool, "CREATE TABLE "+data+" (term bigint NOT NULL)")
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+data+", "+pgx.Identifier{opts.Table}.Sanitize())
		_, _ = pool.Exec(context.Background(), "DROP FUNCTION IF EXISTS "+fenceFunc(Options{Schema: DefaultSchema, Table: opts.Table})+"(text, bigint)")
	})
	b, err := New(pool, "e", opts)
	if err != nil {
		t.Fatal(err)
	}
	feed, err := base.New(b, "a", base.Options{Timing: feedTiming})
	if err != nil {
		t.Fatal(err)
	}
	defer feed.Stop(context.Background())

	write := func(ctx context.Context, term uint64) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		if err := Fence(ctx, tx, opts, "e", term); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+data+" VALUES ($1)", int64(term)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	deposed := make(chan struct{})
	late := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- feed.Run(ctx, func(lctx context.Context, term uint64) error {
			if err := write(lctx, term); err != nil {
				t.Errorf("fenced write of the leader in term %d: %v", term, err)
			}
			<-deposed
			// Paused past the end of its term: its context may not have
			// ended yet. Its fenced write must fail all the same.
			late <- write(context.WithoutCancel(lctx), term)
			cancel()
			<-lctx.Done()
			return nil
		})
	}()

	// Wait for the leader's write, then take over from another store.
	s := openStore(t, pool, opts)
	var cur heartbeat.Record
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		var n int
		_ = pool.QueryRow(ctxT(t), "SELECT count(*) FROM "+data).Scan(&n)
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader made no fenced write")
		}
	}
	for {
		if cur, err = s.Get(ctxT(t), "e"); err != nil {
			t.Fatal(err)
		}
		_, err := s.Heartbeat(ctxT(t), cur, heartbeat.Record{Election: "e", Leader: "z", Term: cur.Term + 1, Lease: time.Minute})
		if err == nil {
			break
		}
	}
	close(deposed)
	wantFenced(t, "fenced write of the deposed leader", <-late, "asked", "found")
	var n int
	if err := pool.QueryRow(ctxT(t), "SELECT count(*) FROM "+data).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows, %v: the deposed leader's write committed", n, err)
	}
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
