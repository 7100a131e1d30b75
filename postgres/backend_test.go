package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

const wait = 5 * time.Second

// open returns a started, created backend, closed at cleanup.
func open(t *testing.T, pool *pgxpool.Pool, election string, opts Options) *Backend {
	t.Helper()
	b, err := New(pool, election, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Start(ctxT(t)); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := b.Create(ctxT(t)); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return b
}

func sub(t *testing.T, b *Backend) <-chan base.Notification {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := b.Subscribe(ctx)
	if err != nil {
		cancel()
		t.Fatalf("Subscribe: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
	})
	return ch
}

// recv returns the next notification, failing after wait.
func recv(t *testing.T, ch <-chan base.Notification) base.Notification {
	t.Helper()
	select {
	case n, ok := <-ch:
		if !ok {
			t.Fatal("feed closed")
		}
		return n
	case <-time.After(wait):
		t.Fatal("no notification within", wait)
	}
	panic("unreachable")
}

// hb writes leader, term and value on the write expected (the zero Record:
// none) and fails the test if that is refused.
func hb(t *testing.T, b *Backend, expected heartbeat.Record, leader string, term uint64, value []byte) heartbeat.Record {
	t.Helper()
	r, err := b.Heartbeat(ctxT(t), expected, heartbeat.Record{Leader: leader, Term: term, Value: value})
	if err != nil {
		t.Fatalf("Heartbeat(%v, %q, %d): %v", expected, leader, term, err)
	}
	return r
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(ctxT(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestNewRejectsBadNames(t *testing.T) {
	pool := &pgxpool.Pool{} // never used: New does no I/O
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name     string
		pool     *pgxpool.Pool
		election string
		opts     Options
	}{
		{"nil pool", nil, "e", Options{}},
		{"empty election", pool, "", Options{}},
		{"election with a control character", pool, "e\x01", Options{}},
		{"election too long", pool, strings.Repeat("e", heartbeat.MaxNameLen+1), Options{}},
		{"schema with a quote", pool, "e", Options{Schema: `a"b`}},
		{"schema with a dot", pool, "e", Options{Schema: "a.b"}},
		{"table starting with a digit", pool, "e", Options{Table: "1abc"}},
		{"table with a space", pool, "e", Options{Table: "a b"}},
		{"table with SQL", pool, "e", Options{Table: "x; DROP TABLE y"}},
		{"table of 64 bytes", pool, "e", Options{Table: long}},
		{"table non-ASCII", pool, "e", Options{Table: "tablé"}},
		{"watch table with a dash", pool, "e", Options{WatchTable: "a-b"}},
		{"watch schema with a dash", pool, "e", Options{WatchTable: "w", WatchSchema: "a-b"}},
		{"channel prefix with a dash", pool, "e", Options{ChannelPrefix: "a-b"}},
		{"channel prefix too long for the function names", pool, "e", Options{ChannelPrefix: strings.Repeat("c", MaxChannelPrefixLen+1)}},
		{"watch table is the election table", pool, "e", Options{WatchTable: DefaultTable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(tc.pool, tc.election, tc.opts)
			if !errors.Is(err, base.ErrInvalidConfig) {
				t.Fatalf("New: %v, want an error matching base.ErrInvalidConfig", err)
			}
			if b != nil {
				t.Fatal("New returned a backend with its error")
			}
			if !strings.HasPrefix(err.Error(), "postgres: ") {
				t.Errorf("error %q lacks the postgres: prefix", err)
			}
		})
	}
	if _, err := SchemaSQL(Options{Table: "a-b"}); !errors.Is(err, base.ErrInvalidConfig) {
		t.Errorf("SchemaSQL with a bad name: %v", err)
	}
}

func TestHeartbeatCompareAndSet(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	b := open(t, pool, "e1", opts)
	ctx := ctxT(t)

	if _, err := b.Get(ctx); !errors.Is(err, base.ErrNotFound) {
		t.Fatalf("Get of a missing record: %v, want ErrNotFound", err)
	}
	var ce *base.ConflictError
	if _, err := b.Heartbeat(ctx, heartbeat.Record{Revision: 7, Leader: "a", Term: 1}, heartbeat.Record{Leader: "a", Term: 1}); !errors.As(err, &ce) || ce.Current.Revision != 0 {
		t.Fatalf("write on revision 7 of a missing record: %v, want a conflict with an empty record", err)
	}

	before := time.Now()
	r1 := hb(t, b, heartbeat.Record{}, "a", 5, []byte("addr"))
	if r1.Revision != 1 || r1.Term != 5 || r1.Leader != "a" || string(r1.Value) != "addr" || r1.Election != "e1" {
		t.Fatalf("first claim stored %+v", r1)
	}
	if d := r1.Timestamp.Sub(before); d < -time.Minute || d > time.Minute {
		t.Fatalf("server timestamp %v far from %v", r1.Timestamp, before)
	}
	for _, expected := range []heartbeat.Record{{}, {Revision: 2, Leader: "a", Term: 5}, {Revision: 9, Leader: "a", Term: 5},
		{Revision: 1, Leader: "b", Term: 5}, {Revision: 1, Leader: "a", Term: 4}} {
		_, err := b.Heartbeat(ctx, expected, heartbeat.Record{Leader: "b", Term: 6})
		if !errors.As(err, &ce) || !ce.Current.Equal(r1) {
			t.Fatalf("write expecting %v: %v, want a conflict carrying %+v", expected, err, r1)
		}
	}
	r2 := hb(t, b, r1, "a", 5, nil)
	if r2.Revision != 2 || r2.Value != nil || r2.Timestamp.Before(r1.Timestamp) {
		t.Fatalf("renewal stored %+v after %+v", r2, r1)
	}
	r3 := hb(t, b, r2, "", 5, nil)
	if !r3.Vacant() || r3.Term != 5 {
		t.Fatalf("vacant write stored %+v", r3)
	}
	got, err := b.Get(ctx)
	if err != nil || !got.Equal(r3) {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, r3)
	}

	// A record of another election on the same table is independent.
	other := open(t, pool, "e2", opts)
	if r := hb(t, other, heartbeat.Record{}, "x", 1, nil); r.Revision != 1 {
		t.Fatalf("other election stored %+v", r)
	}

	for _, tc := range []struct {
		name string
		next heartbeat.Record
	}{
		{"value too long", heartbeat.Record{Leader: "a", Term: 1, Value: make([]byte, heartbeat.MaxValueLen+1)}},
		{"leader with a control character", heartbeat.Record{Leader: "a\n", Term: 1}},
		{"vacant with a value", heartbeat.Record{Term: 1, Value: []byte("v")}},
		{"another election", heartbeat.Record{Election: "e2", Leader: "a", Term: 1}},
		{"term beyond bigint", heartbeat.Record{Leader: "a", Term: 1 << 63}},
	} {
		_, err := b.Heartbeat(ctx, heartbeat.Record{Revision: 3, Leader: "a", Term: 1}, tc.next)
		if !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, heartbeat.ErrInvalidRecord) {
			t.Errorf("%s: %v, want ErrInvalidConfig and heartbeat.ErrInvalidRecord", tc.name, err)
		}
	}
}

func TestConcurrentClaimsHaveOneWinner(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	for _, tc := range []struct {
		name     string
		existing bool
	}{{"first claim inserts", false}, {"claim updates", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 20
			election := uniqueName(t)
			bs := make([]*Backend, n)
			for i := range bs {
				bs[i] = open(t, pool, election, opts)
			}
			var expected heartbeat.Record
			if tc.existing {
				expected = hb(t, bs[0], heartbeat.Record{}, "old", 1, nil)
			}
			var (
				wg      sync.WaitGroup
				mu      sync.Mutex
				winners []string
				start   = make(chan struct{})
			)
			for i, b := range bs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					id := fmt.Sprintf("node-%d", i)
					_, err := b.Heartbeat(ctxT(t), expected, heartbeat.Record{Leader: id, Term: 2})
					var ce *base.ConflictError
					switch {
					case err == nil:
						mu.Lock()
						winners = append(winners, id)
						mu.Unlock()
					case errors.As(err, &ce):
						if ce.Current.Revision != expected.Revision+1 || ce.Current.Leader == id {
							t.Errorf("%s: conflict carries %+v, want the winner's record", id, ce.Current)
						}
					default:
						t.Errorf("%s: %v", id, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(winners) != 1 {
				t.Fatalf("winners %v, want exactly one", winners)
			}
			got, err := bs[0].Get(ctxT(t))
			if err != nil || got.Leader != winners[0] || got.Revision != expected.Revision+1 {
				t.Fatalf("stored %+v, %v; want %s at revision %d", got, err, winners[0], expected.Revision+1)
			}
		})
	}
}

func TestNotificationsInOrder(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	b := open(t, pool, "e", opts)
	other := open(t, pool, "other", opts)
	ch := sub(t, b)

	var last, lastOther heartbeat.Record
	for i := range 50 {
		last = hb(t, b, last, "a", uint64(i/10+1), []byte{byte(i)})
		if i%10 == 0 {
			lastOther = hb(t, other, lastOther, "x", 1, nil) // never delivered to b's feed
		}
	}
	for rev := uint64(1); rev <= last.Revision; rev++ {
		n := recv(t, ch)
		if n.Type != base.RecordChanged || n.Record.Revision != rev || n.Record.Election != "e" {
			t.Fatalf("notification %d: %v %+v, want revision %d of e", rev, n.Type, n.Record, rev)
		}
		if rev == last.Revision && !n.Record.Equal(last) {
			t.Fatalf("last notification %+v, want the stored %+v", n.Record, last)
		}
	}

	// Writes from another client (as from psql) are announced too.
	table := pgx.Identifier{"public", opts.Table}.Sanitize()
	mustExec(t, pool, "UPDATE "+table+" SET leader = 'psql', revision = revision + 1 WHERE election = 'e'")
	if n := recv(t, ch); n.Type != base.RecordChanged || n.Record.Leader != "psql" || n.Record.Revision != last.Revision+1 {
		t.Fatalf("foreign write arrived as %v %+v", n.Type, n.Record)
	}
	mustExec(t, pool, "DELETE FROM "+table+" WHERE election = 'e'")
	if n := recv(t, ch); n.Type != base.RecordDeleted {
		t.Fatalf("delete arrived as %v", n.Type)
	}
}

func TestWatchTable(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	for _, tc := range []struct {
		name, ddl, insert string
		key               string // the Key expected, as JSON
	}{
		{"one-column key", "(id text PRIMARY KEY, doc text)", "INSERT INTO %s VALUES ('k1', $1)", `"k1"`},
		{"compound key", "(a int, b text, doc text, PRIMARY KEY (b, a))", "INSERT INTO %s VALUES (7, 'x', $1)", `{"b":"x","a":7}`},
		{"no key", "(id text, doc text)", "INSERT INTO %s VALUES ('k1', $1)", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			watch := uniqueName(t)
			wt := pgx.Identifier{"public", watch}.Sanitize()
			mustExec(t, pool, "CREATE TABLE "+wt+" "+tc.ddl)
			b := open(t, pool, "e", Options{Table: uniqueName(t), WatchTable: watch})
			ch := sub(t, b)

			mustExec(t, pool, fmt.Sprintf(tc.insert, wt), "small")
			mustExec(t, pool, "UPDATE "+wt+" SET doc = $1", "bigger")
			mustExec(t, pool, "UPDATE "+wt+" SET doc = $1", strings.Repeat("z", 9000))
			mustExec(t, pool, "DELETE FROM "+wt)
			for i, want := range []struct {
				op       base.Op
				old, new string
				partial  bool
			}{
				{base.Insert, "", "small", false},
				{base.Update, "small", "bigger", false},
				{base.Update, "", "", true},
				{base.Delete, "", "", true},
			} {
				n := recv(t, ch)
				c := n.Change
				if n.Type != base.OtherChanged || c.Op != want.op || c.Table != watch || c.Partial != want.partial {
					t.Fatalf("change %d: %v %+v, want %v of %s, partial %v", i, n.Type, c, want.op, watch, want.partial)
				}
				if tc.key == "" && c.Key != nil || tc.key != "" && !jsonEqual(c.Key, tc.key) {
					t.Fatalf("change %d: key %s, want %s", i, c.Key, tc.key)
				}
				if want.partial {
					if c.Old != nil || c.New != nil {
						t.Fatalf("change %d: partial change carries Old %d bytes, New %d bytes", i, len(c.Old), len(c.New))
					}
					continue
				}
				if !bytes.Contains(c.New, []byte(`"`+want.new+`"`)) || (want.old == "") != (c.Old == nil) ||
					want.old != "" && !bytes.Contains(c.Old, []byte(`"`+want.old+`"`)) {
					t.Fatalf("change %d: Old %s New %s, want %q and %q", i, c.Old, c.New, want.old, want.new)
				}
				var row map[string]any
				if err := json.Unmarshal(c.New, &row); err != nil {
					t.Fatalf("change %d: New is not a JSON object: %v", i, err)
				}
			}
		})
	}
}

func jsonEqual(a json.RawMessage, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && fmt.Sprint(x) == fmt.Sprint(y)
}

func TestMalformedRows(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	table := pgx.Identifier{"public", opts.Table}.Sanitize()
	for _, tc := range []struct {
		name string
		sql  string
		args []any
	}{
		{"leader with a control character", "INSERT INTO %s (election, leader, term, revision) VALUES ($1, $2, 1, 1)", []any{"bad\x01id"}},
		{"negative term", "INSERT INTO %s (election, leader, term, revision) VALUES ($1, 'a', -1, 1)", nil},
		{"revision zero", "INSERT INTO %s (election, leader, term, revision) VALUES ($1, 'a', 1, 0)", nil},
		{"vacant with a value", "INSERT INTO %s (election, leader, term, revision, value) VALUES ($1, '', 1, 1, 'x')", nil},
		{"value over MaxValueLen", "INSERT INTO %s (election, leader, term, revision, value) VALUES ($1, 'a', 1, 1, $2)",
			[]any{make([]byte, heartbeat.MaxValueLen+1)}},
		{"row too big for a notification", "INSERT INTO %s (election, leader, term, revision, value) VALUES ($1, 'a', 1, 1, $2)",
			[]any{bytes.Repeat([]byte("v"), 20000)}},
		{"timestamp infinity", "INSERT INTO %s (election, leader, term, revision, ts) VALUES ($1, 'a', 1, 1, 'infinity')", nil},
		{"negative lease", "INSERT INTO %s (election, leader, term, revision, lease_us) VALUES ($1, 'a', 1, 1, -1)", nil},
		{"lease over MaxLease", "INSERT INTO %s (election, leader, term, revision, lease_us) VALUES ($1, 'a', 1, 1, $2)",
			[]any{heartbeat.MaxLease.Microseconds() + 1}},
		{"leader too long", "INSERT INTO %s (election, leader, term, revision) VALUES ($1, $2, 1, 1)",
			[]any{strings.Repeat("l", 7000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			election := uniqueName(t)
			b := open(t, pool, election, opts)
			ch := sub(t, b)
			mustExec(t, pool, fmt.Sprintf(tc.sql, table), append([]any{election}, tc.args...)...)
			if n := recv(t, ch); n.Type != base.Ignored || !errors.Is(n.Err, base.ErrMalformedRecord) {
				t.Fatalf("malformed row arrived as %v (%v), want Ignored with ErrMalformedRecord", n.Type, n.Err)
			}
			if _, err := b.Get(ctxT(t)); !errors.Is(err, base.ErrMalformedRecord) {
				t.Fatalf("Get: %v, want ErrMalformedRecord", err)
			}
			_, err := b.Heartbeat(ctxT(t), heartbeat.Record{}, heartbeat.Record{Leader: "a", Term: 1})
			if !errors.Is(err, base.ErrMalformedRecord) {
				t.Fatalf("Heartbeat over a malformed row: %v, want ErrMalformedRecord", err)
			}
			// The feed goes on.
			mustExec(t, pool, "DELETE FROM "+table+" WHERE election = $1", election)
			if n := recv(t, ch); n.Type != base.RecordDeleted {
				t.Fatalf("after the malformed row: %v, want RecordDeleted", n.Type)
			}
			r := hb(t, b, heartbeat.Record{}, "a", 1, nil)
			if n := recv(t, ch); n.Type != base.RecordChanged || !n.Record.Equal(r) {
				t.Fatalf("after the malformed row: %v %+v, want %+v", n.Type, n.Record, r)
			}
		})
	}
}

func TestListenerKilled(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	b1 := open(t, pool, "e1", opts)
	b2 := open(t, pool, "e2", opts)
	ch1, ch2 := sub(t, b1), sub(t, b2)
	if b1.listener != b2.listener {
		t.Fatal("two backends on one pool have two listeners")
	}
	pid := b1.listener.connPID()
	if pid == 0 {
		t.Fatal("listener not connected after Subscribe")
	}
	var n int
	if err := pool.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND application_name = 'leaderfeed listener'", pid).Scan(&n); err != nil || n != 1 {
		t.Fatalf("listener pid %d in pg_stat_activity: %d, %v", pid, n, err)
	}
	mustExec(t, pool, "SELECT pg_terminate_backend($1)", int(pid))
	for i, ch := range []<-chan base.Notification{ch1, ch2} {
		if n := recv(t, ch); n.Type != base.Failed || n.Err == nil {
			t.Fatalf("subscription %d: %v, want Failed", i, n.Type)
		}
		select {
		case _, ok := <-ch:
			if ok {
				t.Fatalf("subscription %d: notification after Failed", i)
			}
		case <-time.After(wait):
			t.Fatalf("subscription %d: not closed after Failed", i)
		}
	}
	ch := sub(t, b1)
	if p := b1.listener.connPID(); p == 0 || p == pid {
		t.Fatalf("listener pid after reconnecting: %d (was %d)", p, pid)
	}
	r := hb(t, b1, heartbeat.Record{}, "a", 1, nil)
	if n := recv(t, ch); n.Type != base.RecordChanged || !n.Record.Equal(r) {
		t.Fatalf("after reconnecting: %v %+v", n.Type, n.Record)
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	b := open(t, pool, "e", Options{Table: uniqueName(t)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Start", func() error { return b.Start(ctx) }},
		{"Create", func() error { return b.Create(ctx) }},
		{"Get", func() error { _, err := b.Get(ctx); return err }},
		{"Heartbeat", func() error {
			_, err := b.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Leader: "a", Term: 1})
			return err
		}},
		{"Subscribe", func() error { _, err := b.Subscribe(ctx); return err }},
	} {
		if err := tc.call(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v, want an error matching context.Canceled", tc.name, err)
		}
	}
	if _, err := b.Get(ctxT(t)); !errors.Is(err, base.ErrNotFound) {
		t.Fatalf("the cancelled Heartbeat wrote: Get = %v", err)
	}

	// A feed whose context ends closes without a Failed notification.
	sctx, scancel := context.WithCancel(context.Background())
	ch, err := b.Subscribe(sctx)
	if err != nil {
		t.Fatal(err)
	}
	hb(t, b, heartbeat.Record{}, "a", 1, nil)
	scancel()
	deadline := time.After(wait)
	for {
		select {
		case n, ok := <-ch:
			if !ok {
				return
			}
			if n.Type == base.Failed {
				t.Fatalf("Failed after the context ended: %v", n.Err)
			}
		case <-deadline:
			t.Fatal("feed open after its context ended")
		}
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	b := open(t, pool, "e", Options{Table: uniqueName(t)})
	ch, err := b.Subscribe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := b.Close(); err != nil {
			t.Fatalf("Close %d: %v", i, err)
		}
	}
	for range ch {
	}
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Start", func() error { return b.Start(ctx) }},
		{"Create", func() error { return b.Create(ctx) }},
		{"Get", func() error { _, err := b.Get(ctx); return err }},
		{"Heartbeat", func() error {
			_, err := b.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Leader: "a", Term: 1})
			return err
		}},
		{"Subscribe", func() error { _, err := b.Subscribe(ctx); return err }},
	} {
		if err := tc.call(); !errors.Is(err, base.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", tc.name, err)
		}
	}
	if pool.Ping(ctx) != nil {
		t.Fatal("Close closed the caller's pool")
	}
}

func TestCreate(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := ctxT(t)

	t.Run("missing table with NoCreate", func(t *testing.T) {
		b, err := New(pool, "e", Options{Table: uniqueName(t), NoCreate: true})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !strings.Contains(err.Error(), "NoCreate") {
			t.Fatalf("Create: %v, want ErrInvalidConfig naming NoCreate", err)
		}
	})

	t.Run("racing creators in a new schema", func(t *testing.T) {
		opts := Options{Schema: uniqueName(t), Table: "elections", WatchTable: "mine"}
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{opts.Schema}.Sanitize()+" CASCADE")
		})
		// The watched table must exist: the backend never creates it.
		b0, _ := New(pool, "e", opts)
		defer b0.Close()
		if err := b0.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) {
			t.Fatalf("Create with a missing watched table: %v", err)
		}
		mustExec(t, pool, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{opts.Schema}.Sanitize())
		mustExec(t, pool, "CREATE TABLE "+pgx.Identifier{opts.Schema, "mine"}.Sanitize()+" (id int PRIMARY KEY)")
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b, err := New(pool, fmt.Sprintf("e%d", i), opts)
				if err != nil {
					t.Error(err)
					return
				}
				defer b.Close()
				for range 2 {
					if err := b.Create(ctx); err != nil {
						t.Errorf("Create %d: %v", i, err)
					}
				}
			}()
		}
		wg.Wait()
		opts.NoCreate = true
		b, _ := New(pool, "e", opts)
		defer b.Close()
		if err := b.Create(ctx); err != nil {
			t.Fatalf("check after creating: %v", err)
		}
	})

	t.Run("SchemaSQL makes what Create checks", func(t *testing.T) {
		opts := Options{Table: uniqueName(t), ChannelPrefix: "lf_sql"}
		script, err := SchemaSQL(opts)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, pool, script)
		b, _ := New(pool, "e", opts)
		defer b.Close()
		if err := b.Create(ctx); err != nil {
			t.Fatalf("Create after SchemaSQL: %v", err)
		}
		ch := sub(t, b)
		r := hb(t, b, heartbeat.Record{}, "a", 1, nil)
		if n := recv(t, ch); !n.Record.Equal(r) {
			t.Fatalf("notification %v %+v, want %+v", n.Type, n.Record, r)
		}
	})

	t.Run("a table of an older version gains lease_us", func(t *testing.T) {
		table := uniqueName(t)
		quoted := pgx.Identifier{"public", table}.Sanitize()
		mustExec(t, pool, "CREATE TABLE "+quoted+` (election text PRIMARY KEY, leader text NOT NULL DEFAULT '',
			term bigint NOT NULL DEFAULT 0, revision bigint NOT NULL, ts timestamptz NOT NULL DEFAULT clock_timestamp(),
			value bytea NOT NULL DEFAULT ''::bytea)`)
		mustExec(t, pool, "INSERT INTO "+quoted+" (election, leader, term, revision) VALUES ('e', 'a', 3, 7)")
		checker, _ := New(pool, "e", Options{Table: table, NoCreate: true})
		defer checker.Close()
		if err := checker.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !strings.Contains(err.Error(), "lease_us is missing") {
			t.Fatalf("NoCreate on an old table: %v, want ErrInvalidConfig naming lease_us", err)
		}
		b, _ := New(pool, "e", Options{Table: table})
		defer b.Close()
		if err := b.Create(ctx); err != nil {
			t.Fatalf("Create on an old table: %v", err)
		}
		got, err := b.Get(ctx)
		if err != nil || got.Revision != 7 || got.Lease != 0 {
			t.Fatalf("Get after the upgrade = %+v, %v; want revision 7 and no lease", got, err)
		}
		r := hb(t, b, got, "b", 4, nil)
		if r.Revision != 8 {
			t.Fatalf("claim after the upgrade stored %+v", r)
		}
		if err := checker.Create(ctx); err != nil {
			t.Fatalf("NoCreate check after the upgrade: %v", err)
		}
	})

	t.Run("a vacancy written by an older version keeps lease_us: read as no lease", func(t *testing.T) {
		opts := Options{Table: uniqueName(t)}
		b := open(t, pool, "e", opts)
		r, err := b.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Leader: "a", Term: 1, Lease: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		// What an older version's UPDATE does: it does not know lease_us.
		mustExec(t, pool, "UPDATE "+pgx.Identifier{"public", opts.Table}.Sanitize()+
			" SET leader = '', revision = revision + 1 WHERE election = 'e'")
		got, err := b.Get(ctx)
		if err != nil || !got.Vacant() || got.Lease != 0 || got.Revision != r.Revision+1 {
			t.Fatalf("Get = %+v, %v; want a vacant record without a lease", got, err)
		}
	})

	t.Run("wrong table shape", func(t *testing.T) {
		table := uniqueName(t)
		mustExec(t, pool, "CREATE TABLE "+pgx.Identifier{"public", table}.Sanitize()+" (election text PRIMARY KEY, leader int)")
		b, _ := New(pool, "e", Options{Table: table})
		defer b.Close()
		if err := b.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !strings.Contains(err.Error(), "leader") {
			t.Fatalf("Create on a foreign table: %v", err)
		}
	})
}

func TestSlowReaderGetsLatest(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	b := open(t, pool, "e", Options{Table: uniqueName(t)})
	ch := sub(t, b)
	var last heartbeat.Record
	for i := range coalesceAt * 3 {
		last = hb(t, b, last, "a", uint64(i+1), nil)
	}
	var prev uint64
	for prev < last.Revision {
		n := recv(t, ch)
		if n.Type != base.RecordChanged || n.Record.Revision <= prev {
			t.Fatalf("%v revision %d after %d", n.Type, n.Record.Revision, prev)
		}
		prev = n.Record.Revision
	}
}
