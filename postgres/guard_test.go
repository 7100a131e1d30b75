package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// guardFixture is a Store on a table of its own with election "e" led by
// "a" (led) and node "b" present with incarnation 7.
type guardFixture struct {
	pool  *pgxpool.Pool
	s     *Store
	name  string // of the table
	table string // quoted, with its schema
	led   heartbeat.Record
}

func newGuardFixture(t *testing.T) guardFixture {
	t.Helper()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	f := guardFixture{pool: pool, s: openStore(t, pool, opts), name: opts.Table, table: pgx.Identifier{"public", opts.Table}.Sanitize()}
	var err error
	f.led, err = f.s.Heartbeat(ctxT(t), heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "a", Term: 1, Lease: time.Second, Incarnation: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.s.Present(ctxT(t), "e", backend.Presence{Node: "b", CanLead: true, Token: 9, Incarnation: 7}); err != nil {
		t.Fatal(err)
	}
	return f
}

// begin opens a transaction on f's pool, rolled back at cleanup unless
// committed.
func (f *guardFixture) begin(t *testing.T, ctx context.Context) pgx.Tx {
	t.Helper()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	return tx
}

// handover is the write of a handover of the election to "b".
var handover = heartbeat.Record{Election: "e", Leader: "b", Term: 2, Lease: time.Second, Handover: 9}

// guardOfB is the guard of b's presence record, of its incarnation.
var guardOfB = backend.Guard{Node: "b", Incarnation: 7}

// guardedArgs are the parameters of guardedUpdateSQL for a write of next
// on expected guarded by g, as HeartbeatGuarded sends them.
func guardedArgs(expected, next heartbeat.Record, g backend.Guard) []any {
	return []any{next.Election, next.Leader, int64(next.Term), valueOf(next), heartbeat.LeaseMicros(next.Lease),
		int64(expected.Revision), expected.Leader, int64(expected.Term), next.Successor, int64(next.Handover),
		int64(next.Incarnation), backend.PresenceKey(next.Election, g.Node), int64(g.Incarnation)}
}

// TestGuardWrites: a guarded write succeeds when the guard's presence
// record (its incarnation) is there, and is announced as Heartbeat's
// writes are; without it, or with another incarnation's, it writes nothing
// and fails with ErrNotPresent; a stale expected record is a conflict
// whatever the guard; invalid arguments fail before any I/O.
func TestGuardWrites(t *testing.T) {
	t.Parallel()
	t.Run("present", func(t *testing.T) {
		t.Parallel()
		f := newGuardFixture(t)
		ch := sub(t, f.s)
		// The subscription is up once it delivers a write of this test.
		r, err := f.s.Heartbeat(ctxT(t), f.led, heartbeat.Record{Election: "e", Leader: "a", Term: 1, Lease: time.Second, Incarnation: 3})
		if err != nil {
			t.Fatal(err)
		}
		for n := recv(t, ch); !n.Record.Equal(r); n = recv(t, ch) {
		}
		got, err := f.s.HeartbeatGuarded(ctxT(t), r, handover, guardOfB)
		if err != nil {
			t.Fatalf("guarded write with the presence record there: %v", err)
		}
		if got.Leader != "b" || got.Term != 2 || got.Handover != 9 || got.Revision != r.Revision+1 {
			t.Fatalf("guarded write returned %+v", got)
		}
		if n := recv(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(got) {
			t.Fatalf("the guarded write's notification: %v %+v, want %+v", n.Type, n.Record, got)
		}
		if cur, err := f.s.Get(ctxT(t), "e"); err != nil || !cur.Equal(got) {
			t.Fatalf("Get after the guarded write: %+v, %v, want %+v", cur, err, got)
		}
	})
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, f guardFixture)
		guard backend.Guard
	}{
		{"absent", func(t *testing.T, f guardFixture) {
			if err := f.s.Absent(ctxT(t), "e", "b"); err != nil {
				t.Fatal(err)
			}
		}, guardOfB},
		{"another incarnation", func(t *testing.T, f guardFixture) {
			if err := f.s.Present(ctxT(t), "e", backend.Presence{Node: "b", CanLead: true, Token: 10, Incarnation: 8}); err != nil {
				t.Fatal(err)
			}
		}, guardOfB},
		{"another node's presence", func(*testing.T, guardFixture) {}, backend.Guard{Node: "c", Incarnation: 7}},
	} {
		t.Run("not present/"+tc.name, func(t *testing.T) {
			t.Parallel()
			f := newGuardFixture(t)
			tc.setup(t, f)
			_, err := f.s.HeartbeatGuarded(ctxT(t), f.led, handover, tc.guard)
			if !errors.Is(err, backend.ErrNotPresent) || errors.As(err, new(*backend.ConflictError)) {
				t.Fatalf("guarded write without the guard's presence record: %v, want ErrNotPresent", err)
			}
			if !strings.Contains(err.Error(), `"e"`) || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.guard.Node)) {
				t.Errorf("the error names neither the election nor the node: %v", err)
			}
			if cur, err := f.s.Get(ctxT(t), "e"); err != nil || !cur.Equal(f.led) {
				t.Fatalf("the record after a refused guarded write: %+v, %v, want %+v", cur, err, f.led)
			}
		})
	}
	t.Run("conflict", func(t *testing.T) {
		t.Parallel()
		f := newGuardFixture(t)
		cur, err := f.s.Heartbeat(ctxT(t), f.led, heartbeat.Record{Election: "e", Leader: "a", Term: 1, Lease: time.Second, Incarnation: 3})
		if err != nil {
			t.Fatal(err)
		}
		// A conflict wins over a missing guard: the caller must learn the
		// record it has to start from.
		for _, g := range []backend.Guard{guardOfB, {Node: "b", Incarnation: 8}} {
			_, err := f.s.HeartbeatGuarded(ctxT(t), f.led, handover, g)
			var ce *backend.ConflictError
			if !errors.As(err, &ce) || !ce.Current.Equal(cur) || errors.Is(err, backend.ErrNotPresent) {
				t.Fatalf("guarded write on a stale record (guard %+v): %v, want a conflict carrying %+v", g, err, cur)
			}
		}
		// No record at all: a conflict with the empty record, as Heartbeat.
		_, err = f.s.HeartbeatGuarded(ctxT(t), f.led, heartbeat.Record{Election: "none", Leader: "b", Term: 2}, guardOfB)
		var ce *backend.ConflictError
		if !errors.As(err, &ce) || ce.Current.Revision != 0 || ce.Current.Election != "none" {
			t.Fatalf("guarded write on a missing record: %v, want a conflict with the empty record", err)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		t.Parallel()
		s, err := NewStore(&pgxpool.Pool{}, Options{}) // never used: the calls fail before any I/O
		if err != nil {
			t.Fatal(err)
		}
		led := heartbeat.Record{Election: "e", Leader: "a", Term: 1, Revision: 4}
		for _, tc := range []struct {
			name     string
			expected heartbeat.Record
			next     heartbeat.Record
			guard    backend.Guard
		}{
			{"expected revision 0", heartbeat.Record{}, handover, guardOfB},
			{"empty guard node", led, handover, backend.Guard{Incarnation: 7}},
			{"guard node with a control character", led, handover, backend.Guard{Node: "b\x1fc", Incarnation: 7}},
			{"guard incarnation over MaxToken", led, handover, backend.Guard{Node: "b", Incarnation: heartbeat.MaxToken + 1}},
			{"invalid next", led, heartbeat.Record{Election: "e", Term: 2, Value: []byte("v")}, guardOfB},
		} {
			if _, err := s.HeartbeatGuarded(ctxT(t), tc.expected, tc.next, tc.guard); !errors.Is(err, base.ErrInvalidConfig) {
				t.Errorf("%s: %v, want ErrInvalidConfig", tc.name, err)
			}
		}
		_ = s.Close()
		if _, err := s.HeartbeatGuarded(ctxT(t), led, handover, guardOfB); !errors.Is(err, base.ErrClosed) {
			t.Errorf("after Close: %v, want ErrClosed", err)
		}
	})
}

// waitBlockedBy waits until a session waits on a lock that the session
// pid holds, failing the test after wait.
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, pid uint32, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		var n int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND $1::int = ANY(pg_blocking_pids(pid))",
			int32(pid)).Scan(&n)
		if err != nil && ctx.Err() == nil {
			t.Fatalf("%s: reading pg_stat_activity: %v", what, err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: no session waits on the lock within %v", what, wait)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestGuardLocks: the guard's presence row is locked by the guarded write
// until it commits. An Absent that deleted the row first holds the write
// until it commits, and the write then finds no row (ErrNotPresent); a
// guarded write that came first holds an Absent until it commits, so that
// a read after the Absent returned sees the write.
func TestGuardLocks(t *testing.T) {
	t.Parallel()
	t.Run("absent first", func(t *testing.T) {
		t.Parallel()
		f := newGuardFixture(t)
		ctx := ctxT(t)
		tx := f.begin(t, ctx)
		if _, err := tx.Exec(ctx, f.s.absentSQL, backend.PresenceKey("e", "b")); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := f.s.HeartbeatGuarded(ctx, f.led, handover, guardOfB)
			done <- err
		}()
		waitBlockedBy(t, f.pool, tx.Conn().PgConn().PID(), "the guarded write behind an uncommitted Absent")
		select {
		case err := <-done:
			t.Fatalf("the guarded write returned (%v) before the Absent committed", err)
		default:
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, backend.ErrNotPresent) {
			t.Fatalf("the guarded write after the Absent committed: %v, want ErrNotPresent", err)
		}
		if cur, err := f.s.Get(ctx, "e"); err != nil || !cur.Equal(f.led) {
			t.Fatalf("the record: %+v, %v, want %+v", cur, err, f.led)
		}
	})
	t.Run("write first", func(t *testing.T) {
		t.Parallel()
		f := newGuardFixture(t)
		ctx := ctxT(t)
		tx := f.begin(t, ctx)
		written, err := scanRecord(tx.QueryRow(ctx, f.s.guardedUpdateSQL, guardedArgs(f.led, handover, guardOfB)...))
		if err != nil {
			t.Fatalf("the guarded UPDATE in a transaction: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- f.s.Absent(ctx, "e", "b") }()
		waitBlockedBy(t, f.pool, tx.Conn().PgConn().PID(), "an Absent behind an uncommitted guarded write")
		select {
		case err := <-done:
			t.Fatalf("Absent returned (%v) before the guarded write committed", err)
		default:
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Absent: %v", err)
		}
		if cur, err := f.s.Get(ctx, "e"); err != nil || !cur.Equal(written) || cur.Leader != "b" {
			t.Fatalf("the record after the Absent returned: %+v, %v, want the guarded write %+v", cur, err, written)
		}
		if ps, _, err := f.s.Participants(ctx, "e"); err != nil || len(ps) != 0 {
			t.Fatalf("participants after Absent: %+v, %v, want none", ps, err)
		}
	})
}

// TestGuardPlan: the guard's subquery is a lookup of the primary key,
// its row locked (LockRows), in the generic plan the prepared statement
// gets: never a scan of the table, which holds every election and
// presence row.
func TestGuardPlan(t *testing.T) {
	t.Parallel()
	f := newGuardFixture(t)
	ctx := ctxT(t)
	mustExec(t, f.pool, "INSERT INTO "+f.table+" (election, leader, revision, value, incarnation, joined)"+
		" SELECT 'e' || g || chr(31) || 'n', 'n', 0, convert_to('{\"p\":0,\"c\":true}', 'UTF8'), 1, now() FROM generate_series(1, 3000) g")
	mustExec(t, f.pool, "ANALYZE "+f.table)
	conn := genericPlans(t, ctx, f.pool)
	plan := genericPlan(t, ctx, conn, "lf_guarded", f.s.guardedUpdateSQL, "'e', 'b', 2, ''::bytea, 1000000, 1, 'a', 1, '', 9, 0, 'e' || chr(31) || 'b', 7")
	t.Logf("the generic plan of the guarded write:\n%s", plan)
	lock := strings.Index(plan, "LockRows")
	pkey := strings.Index(plan, "Index Scan using "+f.name+"_pkey on "+f.name+" p")
	if strings.Contains(plan, "Seq Scan") || lock < 0 || pkey < lock || !strings.Contains(plan, "Index Cond: (election = $12)") {
		t.Errorf("the guard is not a locked lookup of the primary key:\n%s", plan)
	}
}
