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
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/base/basetest"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

var wait = basetest.Scaled(5 * time.Second)

// open returns a started, created backend, closed at cleanup.
func open(t *testing.T, pool *pgxpool.Pool, election string, opts Options) backend.Election {
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

func sub(t *testing.T, b interface {
	Subscribe(context.Context) (<-chan backend.Notification, error)
}) <-chan backend.Notification {
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
func recv(t *testing.T, ch <-chan backend.Notification) backend.Notification {
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
func hb(t *testing.T, b backend.Election, expected heartbeat.Record, leader string, term uint64, value []byte) heartbeat.Record {
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

	if _, err := b.Get(ctx); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Get of a missing record: %v, want ErrNotFound", err)
	}
	var ce *backend.ConflictError
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
			bs := make([]backend.Election, n)
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
					var ce *backend.ConflictError
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

// TestNotificationsInOrder checks the Store's feed: every revision of
// every election, in commit order, and writes of other clients.
func TestNotificationsInOrder(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	s := openStore(t, pool, opts)
	ch := sub(t, s)

	var last, lastOther heartbeat.Record
	for i := range 50 {
		var err error
		last, err = s.Heartbeat(ctxT(t), last, heartbeat.Record{Election: "e", Leader: "a", Term: uint64(i/10 + 1), Value: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			lastOther, err = s.Heartbeat(ctxT(t), lastOther, heartbeat.Record{Election: "other", Leader: "x", Term: 1})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	var rev, revOther uint64
	for rev < last.Revision || revOther < lastOther.Revision {
		n := recv(t, ch)
		if n.Type != backend.RecordChanged {
			t.Fatalf("%v, want a record", n.Type)
		}
		p := &rev
		if n.Record.Election == "other" {
			p = &revOther
		}
		if n.Record.Revision != *p+1 {
			t.Fatalf("revision %d of %s after %d", n.Record.Revision, n.Record.Election, *p)
		}
		*p = n.Record.Revision
		if n.Record.Election == "e" && rev == last.Revision && !n.Record.Equal(last) {
			t.Fatalf("last notification %+v, want the stored %+v", n.Record, last)
		}
	}

	// Writes from another client (as from psql) are announced too.
	table := pgx.Identifier{"public", opts.Table}.Sanitize()
	mustExec(t, pool, "UPDATE "+table+" SET leader = 'psql', revision = revision + 1 WHERE election = 'e'")
	if n := recv(t, ch); n.Type != backend.RecordChanged || n.Record.Leader != "psql" || n.Record.Revision != last.Revision+1 {
		t.Fatalf("foreign write arrived as %v %+v", n.Type, n.Record)
	}
	mustExec(t, pool, "DELETE FROM "+table+" WHERE election = 'e'")
	if n := recv(t, ch); n.Type != backend.RecordDeleted || n.Election != "e" {
		t.Fatalf("delete arrived as %v of %q", n.Type, n.Election)
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
				op       backend.Op
				old, new string
				partial  bool
			}{
				{backend.Insert, "", "small", false},
				{backend.Update, "small", "bigger", false},
				{backend.Update, "", "", true},
				{backend.Delete, "", "", true},
			} {
				n := recv(t, ch)
				c := n.Change
				if n.Type != backend.OtherChanged || c.Op != want.op || c.Table != watch || c.Partial != want.partial {
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
		{"negative handover token", "INSERT INTO %s (election, leader, term, revision, handover) VALUES ($1, 'a', 1, 1, -1)", nil},
		{"handover token over MaxToken", "INSERT INTO %s (election, leader, term, revision, handover) VALUES ($1, 'a', 1, 1, $2)",
			[]any{int64(heartbeat.MaxToken + 1)}},
		{"negative incarnation", "INSERT INTO %s (election, leader, term, revision, incarnation) VALUES ($1, 'a', 1, 1, -1)", nil},
		{"incarnation over MaxToken", "INSERT INTO %s (election, leader, term, revision, incarnation) VALUES ($1, 'a', 1, 1, $2)",
			[]any{int64(heartbeat.MaxToken + 1)}},
		{"leader too long", "INSERT INTO %s (election, leader, term, revision) VALUES ($1, $2, 1, 1)",
			[]any{strings.Repeat("l", 7000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			election := uniqueName(t)
			b := open(t, pool, election, opts)
			ch := sub(t, b)
			mustExec(t, pool, fmt.Sprintf(tc.sql, table), append([]any{election}, tc.args...)...)
			if n := recv(t, ch); n.Type != backend.Ignored || !errors.Is(n.Err, backend.ErrMalformedRecord) {
				t.Fatalf("malformed row arrived as %v (%v), want Ignored with ErrMalformedRecord", n.Type, n.Err)
			}
			if _, err := b.Get(ctxT(t)); !errors.Is(err, backend.ErrMalformedRecord) {
				t.Fatalf("Get: %v, want ErrMalformedRecord", err)
			}
			_, err := b.Heartbeat(ctxT(t), heartbeat.Record{}, heartbeat.Record{Leader: "a", Term: 1})
			if !errors.Is(err, backend.ErrMalformedRecord) {
				t.Fatalf("Heartbeat over a malformed row: %v, want ErrMalformedRecord", err)
			}
			// The feed goes on.
			mustExec(t, pool, "DELETE FROM "+table+" WHERE election = $1", election)
			if n := recv(t, ch); n.Type != backend.RecordDeleted {
				t.Fatalf("after the malformed row: %v, want RecordDeleted", n.Type)
			}
			r := hb(t, b, heartbeat.Record{}, "a", 1, nil)
			if n := recv(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
				t.Fatalf("after the malformed row: %v %+v, want %+v", n.Type, n.Record, r)
			}
		})
	}
}

// openStore returns a started, created Store, closed at cleanup.
func openStore(t *testing.T, pool *pgxpool.Pool, opts Options) *Store {
	t.Helper()
	s, err := NewStore(pool, opts)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Start(ctxT(t)); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := s.Create(ctxT(t)); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return s
}

// listeners counts the server processes among pids that are LISTEN
// connections of leaderfeed.
func listeners(t *testing.T, pool *pgxpool.Pool, pids ...uint32) int {
	t.Helper()
	ids := make([]int32, len(pids))
	for i, p := range pids {
		ids[i] = int32(p)
	}
	var n int
	if err := pool.QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND application_name = 'leaderfeed listener'", ids).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestListenerKilled(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := openStore(t, pool, Options{Table: uniqueName(t)})
	ch := sub(t, s)
	pids := s.listenerPIDs()
	if len(pids) != 1 || pids[0] == 0 {
		t.Fatalf("listener pids after one Subscribe: %v, want one", pids)
	}
	pid := pids[0]
	if n := listeners(t, pool, pid); n != 1 {
		t.Fatalf("listener pid %d in pg_stat_activity: %d", pid, n)
	}
	mustExec(t, pool, "SELECT pg_terminate_backend($1)", int(pid))
	if n := recv(t, ch); n.Type != backend.Failed || n.Err == nil {
		t.Fatalf("after the kill: %v, want Failed", n.Type)
	}
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("notification after Failed")
		}
	case <-time.After(wait):
		t.Fatal("not closed after Failed")
	}
	if p := s.listenerPIDs(); len(p) != 0 {
		t.Fatalf("listener pids after the failure: %v, want none", p)
	}
	ch = sub(t, s)
	if p := s.listenerPIDs(); len(p) != 1 || p[0] == pid {
		t.Fatalf("listener pids after subscribing again: %v (was %d)", p, pid)
	}
	r, err := s.Heartbeat(ctxT(t), heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "a", Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	if n := recv(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
		t.Fatalf("after reconnecting: %v %+v", n.Type, n.Record)
	}
}

// TestStoreFeed checks the Store's raw changefeed: every election of the
// table, deletions and malformed rows named by election, the connection
// closed when the subscription's context ends or the Store closes.
func TestStoreFeed(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	table := pgx.Identifier{"public", opts.Table}.Sanitize()
	s := openStore(t, pool, opts)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := s.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := s.Heartbeat(ctxT(t), heartbeat.Record{}, heartbeat.Record{Election: "e1", Leader: "a", Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.Heartbeat(ctxT(t), heartbeat.Record{}, heartbeat.Record{Election: "e2", Leader: "b", Term: 1, Value: bytes.Repeat([]byte("v"), 100)})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, "INSERT INTO "+table+" (election, leader, term, revision) VALUES ('bad', 'a', -1, 1)")
	mustExec(t, pool, "INSERT INTO "+table+" (election, leader, term, revision, value) VALUES ('big', 'a', 1, 1, $1)", bytes.Repeat([]byte("v"), 20000))
	mustExec(t, pool, "DELETE FROM "+table+" WHERE election = 'e1'")
	for i, want := range []func(n backend.Notification) bool{
		func(n backend.Notification) bool { return n.Type == backend.RecordChanged && n.Record.Equal(r1) },
		func(n backend.Notification) bool { return n.Type == backend.RecordChanged && n.Record.Equal(r2) },
		func(n backend.Notification) bool {
			return n.Type == backend.Ignored && n.Election == "bad" && errors.Is(n.Err, backend.ErrMalformedRecord)
		},
		func(n backend.Notification) bool {
			return n.Type == backend.Ignored && n.Election == "big" && errors.Is(n.Err, backend.ErrMalformedRecord)
		},
		func(n backend.Notification) bool { return n.Type == backend.RecordDeleted && n.Election == "e1" },
	} {
		if n := recv(t, ch); !want(n) {
			t.Fatalf("notification %d: %v %+v (election %q, %v)", i, n.Type, n.Record, n.Election, n.Err)
		}
	}

	// Two subscriptions, two connections; the one whose context ends
	// closes its channel without Failed, and its connection.
	ch2 := sub(t, s)
	pids := s.listenerPIDs()
	if len(pids) != 2 {
		t.Fatalf("listener pids with two subscriptions: %v", pids)
	}
	cancel()
	for n := range ch {
		if n.Type == backend.Failed {
			t.Fatalf("Failed after the context ended: %v", n.Err)
		}
	}
	if p := s.listenerPIDs(); len(p) != 1 {
		t.Fatalf("listener pids after one subscription ended: %v", p)
	}

	// Close ends the other one with ErrClosed and closes its connection.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := recv(t, ch2); n.Type != backend.Failed || !errors.Is(n.Err, base.ErrClosed) {
		t.Fatalf("after Close: %v (%v), want Failed matching ErrClosed", n.Type, n.Err)
	}
	deadline := time.Now().Add(wait)
	for listeners(t, pool, pids...) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("LISTEN connections %v still open after Close", pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := s.Subscribe(ctxT(t)); !errors.Is(err, base.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
	if _, err := s.HeartbeatBatch(ctxT(t), []backend.Write{{Next: heartbeat.Record{Election: "e", Leader: "a", Term: 1}}}); !errors.Is(err, base.ErrClosed) {
		t.Fatalf("HeartbeatBatch after Close: %v", err)
	}
}

// TestStoreFeedFunc checks SubscribeFunc: the notifications Subscribe
// would send, in order, on one goroutine; Failed last when the connection
// is lost or the Store closes; nothing after cancel returns, and the
// connection closed with it.
func TestStoreFeedFunc(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := openStore(t, pool, Options{Table: uniqueName(t)})
	var _ backend.FuncSubscriber = s
	hb := storeHB(s)
	subscribe := func() (<-chan backend.Notification, func()) {
		t.Helper()
		// Never full in this test: deliver must not block.
		ch := make(chan backend.Notification, 64)
		var mu sync.Mutex
		running, failed := false, false
		cancel, err := s.SubscribeFunc(ctxT(t), func(n backend.Notification) {
			mu.Lock()
			if running || failed {
				t.Errorf("delivery of %v while another runs or after Failed", n.Type)
			}
			running, failed = true, n.Type == backend.Failed
			mu.Unlock()
			ch <- n
			mu.Lock()
			running = false
			mu.Unlock()
		})
		if err != nil {
			t.Fatalf("SubscribeFunc: %v", err)
		}
		return ch, cancel
	}

	ch, cancel := subscribe()
	r1 := hb(t, heartbeat.Record{}, "e1", "a", 1, nil)
	r2 := hb(t, r1, "e1", "a", 1, []byte("v"))
	for i, want := range []heartbeat.Record{r1, r2} {
		if n := recv(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(want) {
			t.Fatalf("notification %d: %v %+v, want %+v", i, n.Type, n.Record, want)
		}
	}
	killListeners(t, pool, s)
	if n := recv(t, ch); n.Type != backend.Failed || n.Err == nil {
		t.Fatalf("after the kill: %v, want Failed", n.Type)
	}
	cancel()
	if p := s.listenerPIDs(); len(p) != 0 {
		t.Fatalf("listener pids after the failure: %v, want none", p)
	}

	// cancel: nothing is delivered once it returned, and the connection
	// is closed.
	ch, cancel = subscribe()
	pids := s.listenerPIDs()
	cancel()
	if p := s.listenerPIDs(); len(p) != 0 {
		t.Fatalf("listener pids after cancel: %v, want none", p)
	}
	hb(t, r2, "e1", "a", 1, []byte("w"))
	select {
	case n := <-ch:
		t.Fatalf("delivered after cancel returned: %v", n.Type)
	case <-time.After(100 * time.Millisecond):
	}
	deadline := time.Now().Add(wait)
	for listeners(t, pool, pids...) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("LISTEN connection %v still open after cancel", pids)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Close ends a subscription with Failed matching ErrClosed.
	ch, cancel = subscribe()
	defer cancel()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := recv(t, ch); n.Type != backend.Failed || !errors.Is(n.Err, base.ErrClosed) {
		t.Fatalf("after Close: %v (%v), want Failed matching ErrClosed", n.Type, n.Err)
	}
	if _, err := s.SubscribeFunc(ctxT(t), func(backend.Notification) {}); !errors.Is(err, base.ErrClosed) {
		t.Fatalf("SubscribeFunc after Close: %v", err)
	}
}

// storeHB is hb on a Store.
func storeHB(s *Store) func(t *testing.T, expected heartbeat.Record, election, leader string, term uint64, value []byte) heartbeat.Record {
	return func(t *testing.T, expected heartbeat.Record, election, leader string, term uint64, value []byte) heartbeat.Record {
		t.Helper()
		r, err := s.Heartbeat(ctxT(t), expected, heartbeat.Record{Election: election, Leader: leader, Term: term, Value: value})
		if err != nil {
			t.Fatalf("Heartbeat(%v, %q, %d): %v", expected, leader, term, err)
		}
		return r
	}
}

// TestStoreFeedFuncCancelledContext: SubscribeFunc with a context that has
// ended fails and leaves no connection; ctx ending after it returned ends
// nothing (it bounds the call only).
func TestStoreFeedFuncCancelledContext(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := openStore(t, pool, Options{Table: uniqueName(t)})
	hb := storeHB(s)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.SubscribeFunc(ctx, func(backend.Notification) {}); !errors.Is(err, context.Canceled) {
		t.Fatalf("SubscribeFunc with an ended context: %v, want context.Canceled", err)
	}
	if p := s.listenerPIDs(); len(p) != 0 {
		t.Fatalf("listener pids: %v, want none", p)
	}
	ctx, cancel = context.WithCancel(context.Background())
	ch := make(chan backend.Notification, 8)
	stop, err := s.SubscribeFunc(ctx, func(n backend.Notification) { ch <- n })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cancel()
	r := hb(t, heartbeat.Record{}, "e", "a", 1, nil)
	if n := recv(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
		t.Fatalf("after the call's context ended: %v %+v, want the record", n.Type, n.Record)
	}
}

// TestHeartbeatBatch checks that each write of a batch gets what a single
// Heartbeat gives: a create, a renewal, a claim, a stale write, a write
// over a malformed row, a write on a missing record, an invalid write.
func TestHeartbeatBatch(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	table := pgx.Identifier{"public", opts.Table}.Sanitize()
	s := openStore(t, pool, opts)
	ctx := ctxT(t)
	single := func(expected heartbeat.Record, next heartbeat.Record) heartbeat.Record {
		t.Helper()
		r, err := s.Heartbeat(ctx, expected, next)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	renewed := single(heartbeat.Record{}, heartbeat.Record{Election: "renewed", Leader: "a", Term: 1})
	claimed := single(heartbeat.Record{}, heartbeat.Record{Election: "claimed", Leader: "a", Term: 1})
	claimed = single(claimed, heartbeat.Record{Election: "claimed", Term: 1})
	stale1 := single(heartbeat.Record{}, heartbeat.Record{Election: "stale", Leader: "a", Term: 1})
	stale2 := single(stale1, heartbeat.Record{Election: "stale", Leader: "b", Term: 2})
	exists := single(heartbeat.Record{}, heartbeat.Record{Election: "exists", Leader: "x", Term: 3})
	mustExec(t, pool, "INSERT INTO "+table+" (election, leader, term, revision) VALUES ('bad', $1, 1, 1)", "evil\x01")
	mustExec(t, pool, "INSERT INTO "+table+" (election, leader, term, revision) VALUES ('bad2', 'a', -1, 1)")

	writes := []backend.Write{
		{Expected: renewed, Next: heartbeat.Record{Election: "renewed", Leader: "a", Term: 1, Value: []byte("v"), Lease: time.Second}},
		{Next: heartbeat.Record{Election: "created", Leader: "c", Term: 1, Lease: 1500 * time.Microsecond}},
		{Expected: claimed, Next: heartbeat.Record{Election: "claimed", Leader: "b", Term: 2}},
		{Expected: stale1, Next: heartbeat.Record{Election: "stale", Leader: "a", Term: 1}},
		{Expected: heartbeat.Record{Revision: 1, Leader: "a", Term: 1}, Next: heartbeat.Record{Election: "bad", Leader: "a", Term: 2}},
		{Next: heartbeat.Record{Election: "bad2", Leader: "a", Term: 2}},
		{Expected: heartbeat.Record{Revision: 4, Leader: "a", Term: 1}, Next: heartbeat.Record{Election: "missing", Leader: "a", Term: 2}},
		{Next: heartbeat.Record{Election: "exists", Leader: "y", Term: 4}},
		{Next: heartbeat.Record{Election: "invalid", Leader: "a\n", Term: 1}},
		{Next: heartbeat.Record{Election: "", Leader: "a", Term: 1}},
	}
	res, err := s.HeartbeatBatch(ctx, writes)
	if err != nil {
		t.Fatalf("HeartbeatBatch: %v", err)
	}
	if len(res) != len(writes) {
		t.Fatalf("%d results for %d writes", len(res), len(writes))
	}
	ok := func(i int, rev uint64) {
		t.Helper()
		r, w := res[i], writes[i].Next
		if r.Err != nil || r.Record.Election != w.Election || r.Record.Revision != rev || r.Record.Leader != w.Leader ||
			r.Record.Term != w.Term || !bytes.Equal(r.Record.Value, w.Value) || r.Record.Lease != w.Lease || r.Record.Timestamp.IsZero() {
			t.Errorf("write %d (%s): %+v, %v; want revision %d of %+v", i, w.Election, r.Record, r.Err, rev, w)
		}
		if got, err := s.Get(ctx, w.Election); err != nil || !got.Equal(r.Record) {
			t.Errorf("Get(%s) = %+v, %v; the batch returned %+v", w.Election, got, err, r.Record)
		}
	}
	conflict := func(i int, cur heartbeat.Record) {
		t.Helper()
		var ce *backend.ConflictError
		if r := res[i]; !errors.As(r.Err, &ce) || !ce.Current.Equal(cur) {
			t.Errorf("write %d (%s): %+v, %v; want a conflict carrying %+v", i, writes[i].Next.Election, r.Record, r.Err, cur)
		}
	}
	ok(0, renewed.Revision+1)
	ok(1, 1)
	ok(2, claimed.Revision+1)
	conflict(3, stale2)
	for _, i := range []int{4, 5} {
		if r := res[i]; !errors.Is(r.Err, backend.ErrMalformedRecord) {
			t.Errorf("write %d over a malformed row: %+v, %v; want ErrMalformedRecord", i, r.Record, r.Err)
		}
	}
	conflict(6, heartbeat.Record{Election: "missing"})
	conflict(7, exists)
	for _, i := range []int{8, 9} {
		if r := res[i]; !errors.Is(r.Err, base.ErrInvalidConfig) || !errors.Is(r.Err, heartbeat.ErrInvalidRecord) {
			t.Errorf("invalid write %d: %v, want ErrInvalidConfig and ErrInvalidRecord", i, r.Err)
		}
	}
	// The same writes one at a time give the same outcomes.
	for i, w := range writes[3:8] {
		_, err := s.Heartbeat(ctx, w.Expected, w.Next)
		if (err == nil) != (res[i+3].Err == nil) || errors.Is(err, backend.ErrConflict) != errors.Is(res[i+3].Err, backend.ErrConflict) ||
			errors.Is(err, backend.ErrMalformedRecord) != errors.Is(res[i+3].Err, backend.ErrMalformedRecord) {
			t.Errorf("write %d alone: %v; in the batch: %v", i+3, err, res[i+3].Err)
		}
	}
	if r, err := s.HeartbeatBatch(ctx, nil); err != nil || len(r) != 0 {
		t.Errorf("empty batch: %v, %v", r, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.HeartbeatBatch(cctx, writes[:1]); !errors.Is(err, context.Canceled) {
		t.Errorf("batch with a cancelled context: %v", err)
	}
}

// TestBatchDuplicateElection checks that a batch names each election
// once: the first write or read of an election goes, every later one fails
// alone with ErrInvalidConfig.
func TestBatchDuplicateElection(t *testing.T) {
	t.Parallel()
	s := openStore(t, newPool(t), Options{Table: uniqueName(t)})
	ctx := ctxT(t)
	writes := []backend.Write{
		{Next: heartbeat.Record{Election: "e", Leader: "a", Term: 1}},
		{Next: heartbeat.Record{Election: "e", Leader: "b", Term: 1}},
	}
	res, err := s.HeartbeatBatch(ctx, writes)
	if err != nil || len(res) != 2 {
		t.Fatalf("HeartbeatBatch: %v, %v", res, err)
	}
	if res[0].Err != nil || res[0].Record.Leader != "a" {
		t.Errorf("the first write of e: %+v, %v; want it applied", res[0].Record, res[0].Err)
	}
	if err := res[1].Err; !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, heartbeat.ErrInvalidRecord) || errors.Is(err, backend.ErrConflict) {
		t.Errorf("the second write of e: %v, want ErrInvalidConfig", err)
	}
	reads, err := s.GetBatch(ctx, []string{"e", "e"})
	if err != nil || len(reads) != 2 || reads[0].Err != nil || !reads[0].Record.Equal(res[0].Record) || !errors.Is(reads[1].Err, base.ErrInvalidConfig) {
		t.Errorf("GetBatch(e, e) = %+v, %v; want the record, then ErrInvalidConfig", reads, err)
	}
}

// TestBatchNotificationsInChunks checks that one batched statement sends
// its records in a few notifications under the payload limit, not one per
// row, and that the feed delivers every record of them.
func TestBatchNotificationsInChunks(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t), ChannelPrefix: "lf_chunks"}
	s := openStore(t, pool, opts)
	ch := sub(t, s)
	raw, err := pgx.ConnectConfig(ctxT(t), pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close(context.Background())
	if _, err := raw.Exec(ctxT(t), "LISTEN lf_chunks"); err != nil {
		t.Fatal(err)
	}
	const n = 300
	writes := make([]backend.Write, n)
	for i := range writes {
		writes[i].Next = heartbeat.Record{Election: fmt.Sprintf("e%03d", i), Leader: "a", Term: 1, Value: bytes.Repeat([]byte("v"), i), Lease: time.Second}
	}
	for round := range 2 {
		res, err := s.HeartbeatBatch(ctxT(t), writes)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]heartbeat.Record{}
		for i, r := range res {
			if r.Err != nil {
				t.Fatalf("round %d, write %d: %v", round, i, r.Err)
			}
			want[r.Record.Election] = r.Record
			writes[i].Expected = r.Record
		}
		for len(want) > 0 {
			nt := recv(t, ch)
			if nt.Type != backend.RecordChanged || !nt.Record.Equal(want[nt.Record.Election]) {
				t.Fatalf("round %d: %v %+v, want one of the batch's records", round, nt.Type, nt.Record)
			}
			delete(want, nt.Record.Election)
		}
		var notes, records int
		for records < n {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			msg, err := raw.WaitForNotification(ctx)
			cancel()
			if err != nil {
				t.Fatalf("round %d: %d notifications with %d records, then %v", round, notes, records, err)
			}
			notes++
			if len(msg.Payload) >= 8000 {
				t.Fatalf("payload of %d bytes", len(msg.Payload))
			}
			var p payload
			if err := json.Unmarshal([]byte(msg.Payload), &p); err != nil || p.Kind != "b" {
				t.Fatalf("payload %.100s: %v", msg.Payload, err)
			}
			records += len(p.Rs)
		}
		// 300 records of about 80 to 480 bytes: about 12 chunks.
		if notes > 20 {
			t.Errorf("round %d: %d notifications for %d records, want a few chunks", round, notes, n)
		}
		t.Logf("round %d: %d records in %d notifications", round, records, notes)
	}
}

// TestHeartbeatBatchOverlapping runs batches of many processes on one set
// of elections at once, in different orders, as followers claiming the
// vacancies of a dead leader do: no deadlock, and each record gets exactly
// one winner per round.
func TestHeartbeatBatchOverlapping(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	const nodes, elections, rounds = 4, 50, 5
	stores := make([]*Store, nodes)
	for i := range stores {
		stores[i] = openStore(t, pool, opts)
	}
	names := make([]string, elections)
	for i := range names {
		names[i] = fmt.Sprintf("e%03d", i)
	}
	cur := make([]heartbeat.Record, elections)
	for r := range rounds {
		var wg sync.WaitGroup
		results := make([][]backend.WriteResult, nodes)
		for n, s := range stores {
			wg.Add(1)
			go func() {
				defer wg.Done()
				writes := make([]backend.Write, elections)
				for i := range writes {
					j := i
					if n%2 == 1 {
						j = elections - 1 - i
					}
					writes[i] = backend.Write{Expected: cur[j], Next: heartbeat.Record{Election: names[j], Leader: fmt.Sprintf("n%d", n), Term: uint64(r + 1)}}
				}
				res, err := s.HeartbeatBatch(ctxT(t), writes)
				if err != nil {
					t.Errorf("node %d, round %d: %v", n, r, err)
					return
				}
				results[n] = res
			}()
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		for i, e := range names {
			var winners int
			for n := range stores {
				j := i
				if n%2 == 1 {
					j = elections - 1 - i
				}
				res := results[n][j]
				if res.Err == nil {
					winners++
					cur[i] = res.Record
				} else if !errors.Is(res.Err, backend.ErrConflict) {
					t.Fatalf("round %d, %s, node %d: %v", r, e, n, res.Err)
				}
			}
			if winners != 1 {
				t.Fatalf("round %d, %s: %d winners", r, e, winners)
			}
		}
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
	if _, err := b.Get(ctxT(t)); !errors.Is(err, backend.ErrNotFound) {
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
			if n.Type == backend.Failed {
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
		if err := b.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "NoCreate") {
			t.Fatalf("Create: %v, want ErrInvalidConfig and ErrRefused naming NoCreate", err)
		}
		// Reading or writing without the table says what is missing and
		// how to make it, not only PostgreSQL's own words; retrying
		// cannot fix it.
		if _, err := b.Get(ctx); !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "let Create make it") {
			t.Fatalf("Get without the table: %v, want ErrRefused saying how to make it", err)
		}
		next := heartbeat.Record{Election: "e", Leader: "a", Term: 1, Lease: time.Second}
		if _, err := b.Heartbeat(ctx, heartbeat.Record{}, next); !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "does not exist") {
			t.Fatalf("Heartbeat without the table: %v, want ErrRefused naming the missing relation", err)
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

	t.Run("SchemaSQL makes what Create checks, and runs again over its own or older triggers", func(t *testing.T) {
		opts := Options{Table: uniqueName(t), ChannelPrefix: "lf_sql"}
		script, err := SchemaSQL(opts)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, pool, script)
		mustExec(t, pool, script)
		// The triggers as versions before skipWhen made them: the script
		// replaces them.
		o, err := opts.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		d := newDDL(o)
		for i := range recordTriggers {
			mustExec(t, pool, d.dropRecordTrigger(opts.ChannelPrefix, i))
			mustExec(t, pool, strings.Replace(d.createRecordTrigger(opts.ChannelPrefix, i), " WHEN ("+skipWhen+")", "", 1))
		}
		mustExec(t, pool, script)
		for _, rt := range recordTriggers {
			def, err := triggerDef(ctx, pool, "public", opts.Table, opts.ChannelPrefix+rt.suffix)
			if err != nil || !strings.Contains(def, notifiedSetting) {
				t.Fatalf("trigger %s after the script: %q, %v", rt.suffix, def, err)
			}
		}
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

	t.Run("SchemaSQL applied again, or over what Create made, changes nothing and locks nothing", func(t *testing.T) {
		watched := uniqueName(t)
		mustExec(t, pool, "CREATE TABLE "+pgx.Identifier{"public", watched}.Sanitize()+" (id int PRIMARY KEY)")
		for _, first := range []string{"SchemaSQL", "Create"} {
			t.Run("after "+first, func(t *testing.T) {
				opts := Options{Table: uniqueName(t), ChannelPrefix: "lf_noop", WatchTable: watched}
				script, err := SchemaSQL(opts)
				if err != nil {
					t.Fatal(err)
				}
				if first == "Create" {
					openStore(t, pool, opts)
				} else {
					mustExec(t, pool, script)
				}
				// What the catalog holds of every object the script makes:
				// a replaced object gets a new row version (xmin).
				o, _ := opts.withDefaults()
				catalog := func() string {
					var out string
					err := pool.QueryRow(ctx, `SELECT string_agg(x, ' ' ORDER BY x) FROM (
						SELECT t.tgname || ':' || t.oid || ':' || t.xmin AS x FROM pg_trigger t
						 WHERE t.tgrelid IN (to_regclass($1), to_regclass($2)) AND NOT t.tgisinternal
						UNION ALL SELECT p.proname || ':' || p.oid || ':' || p.xmin FROM pg_proc p
						 WHERE p.proname IN ($3, $4, $5)
						UNION ALL SELECT c.relname || ':' || c.oid || ':' || c.xmin FROM pg_class c WHERE c.oid = to_regclass($1)
						UNION ALL SELECT c.relname || ':' || c.oid || ':' || c.xmin FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
						 WHERE i.indrelid = to_regclass($1)) AS s`,
						newDDL(o).table, newDDL(o).watch, o.ChannelPrefix+recordFuncSuffix, o.ChannelPrefix+"_notify_change", fenceFuncName(o.Table)).Scan(&out)
					if err != nil {
						t.Fatal(err)
					}
					return out
				}
				before := catalog()
				// A transaction holds the election table (a fence does):
				// a script that altered anything would wait for it.
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if _, err := tx.Exec(ctx, "SELECT * FROM "+newDDL(o).table+" FOR SHARE"); err != nil {
					t.Fatal(err)
				}
				conn, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Release()
				if _, err := conn.Exec(ctx, "SET lock_timeout = '2s'"); err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Exec(ctx, script); err != nil {
					t.Fatalf("the script applied again: %v", err)
				}
				_, _ = conn.Exec(ctx, "RESET lock_timeout")
				if after := catalog(); after != before {
					t.Fatalf("the script applied again changed the catalog:\n%s\n%s", before, after)
				}
			})
		}
	})

	t.Run("SchemaSQL with a watched table runs twice and makes what Create checks", func(t *testing.T) {
		watched := uniqueName(t)
		mustExec(t, pool, "CREATE TABLE "+pgx.Identifier{"public", watched}.Sanitize()+" (id int PRIMARY KEY)")
		opts := Options{Table: uniqueName(t), ChannelPrefix: "lf_sqlw", WatchTable: watched}
		script, err := SchemaSQL(opts)
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, pool, script)
		mustExec(t, pool, script)
		opts.NoCreate = true
		b, _ := New(pool, "e", opts)
		defer b.Close()
		if err := b.Create(ctx); err != nil {
			t.Fatalf("NoCreate check after SchemaSQL twice: %v", err)
		}
	})

	t.Run("a table of an older version gains lease_us and successor", func(t *testing.T) {
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
		if err != nil || got.Revision != 7 || got.Lease != 0 || got.Successor != "" {
			t.Fatalf("Get after the upgrade = %+v, %v; want revision 7, no lease and no successor", got, err)
		}
		r := hb(t, b, got, "b", 4, nil)
		if r.Revision != 8 {
			t.Fatalf("claim after the upgrade stored %+v", r)
		}
		if err := checker.Create(ctx); err != nil {
			t.Fatalf("NoCreate check after the upgrade: %v", err)
		}
	})

	// The versions before a column of addedColumns: the columns of their
	// table, and the columns a NoCreate check finds missing.
	for _, old := range []struct {
		name, cols string
		missing    []string
	}{
		{"handover", "", []string{"handover", "incarnation", "joined"}},
		{"incarnation", ", handover bigint NOT NULL DEFAULT 0", []string{"incarnation", "joined"}},
		{"joined", ", handover bigint NOT NULL DEFAULT 0, incarnation bigint NOT NULL DEFAULT 0", []string{"joined"}},
	} {
		t.Run("a table of the version before "+old.name+": refused with the fix until Create or SchemaSQL adds it", func(t *testing.T) {
			for _, upgrade := range []string{"Create", "SchemaSQL"} {
				t.Run(upgrade, func(t *testing.T) {
					opts := Options{Table: uniqueName(t), ChannelPrefix: "lf_hov"}
					quoted := pgx.Identifier{"public", opts.Table}.Sanitize()
					mustExec(t, pool, "CREATE TABLE "+quoted+` (election text PRIMARY KEY, leader text NOT NULL DEFAULT '',
						term bigint NOT NULL DEFAULT 0, revision bigint NOT NULL, ts timestamptz NOT NULL DEFAULT clock_timestamp(),
						value bytea NOT NULL DEFAULT ''::bytea, lease_us bigint NOT NULL DEFAULT 0, successor text NOT NULL DEFAULT ''`+old.cols+`)`)
					mustExec(t, pool, "INSERT INTO "+quoted+" (election, leader, term, revision, lease_us) VALUES ('e', 'a', 3, 7, 1000000)")
					// A presence row as the old version's Present writes it.
					mustExec(t, pool, "INSERT INTO "+quoted+" (election, leader, term, revision, ts, value) VALUES ($1, 'n', 0, 0, clock_timestamp(), $2)",
						backend.PresenceKey("e", "n"), []byte(`{"p":0,"c":true}`))
					noCreate := opts
					noCreate.NoCreate = true
					checker, _ := NewStore(pool, noCreate)
					defer checker.Close()
					err := checker.Create(ctx)
					if !errors.Is(err, base.ErrRefused) || !errors.Is(err, base.ErrInvalidConfig) || !strings.Contains(err.Error(), "apply SchemaSQL") {
						t.Fatalf("NoCreate on a table without %s: %v, want ErrRefused and ErrInvalidConfig naming SchemaSQL", old.name, err)
					}
					for _, c := range old.missing {
						if !strings.Contains(err.Error(), "column "+c+" is missing") {
							t.Fatalf("NoCreate on a table without %s: %v, want the missing column %s named", old.name, err, c)
						}
					}
					// A Store that skipped Create meets the old table at its
					// first statement that needs a missing column: refused
					// with the same fix. Election records need no joined.
					if old.name != "joined" {
						if _, err := checker.Get(ctx, "e"); !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "apply SchemaSQL") {
							t.Fatalf("Get on a table without %s: %v, want ErrRefused naming SchemaSQL", old.name, err)
						}
						if _, err := checker.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Election: "f", Leader: "a", Term: 1}); !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "apply SchemaSQL") {
							t.Fatalf("Heartbeat on a table without %s: %v, want ErrRefused naming SchemaSQL", old.name, err)
						}
					}
					if _, _, err := checker.Participants(ctx, "e"); !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "apply SchemaSQL") {
						t.Fatalf("Participants on a table without %s: %v, want ErrRefused naming SchemaSQL", old.name, err)
					}
					if err := checker.Present(ctx, "e", backend.Presence{Node: "m", CanLead: true, Incarnation: 1}); !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "apply SchemaSQL") {
						t.Fatalf("Present on a table without %s: %v, want ErrRefused naming SchemaSQL", old.name, err)
					}
					if upgrade == "Create" {
						openStore(t, pool, opts)
					} else {
						script, err := SchemaSQL(opts)
						if err != nil {
							t.Fatal(err)
						}
						mustExec(t, pool, script)
					}
					if err := checker.Create(ctx); err != nil {
						t.Fatalf("NoCreate check after the upgrade: %v", err)
					}
					var keyIndex bool
					if err := pool.QueryRow(ctx, "SELECT "+keyIndexExists("$1::text"), quoted).Scan(&keyIndex); err != nil || !keyIndex {
						t.Fatalf("the key index after the upgrade: %v, %v", keyIndex, err)
					}
					got, err := checker.Get(ctx, "e")
					if err != nil || got.Revision != 7 || got.Lease != time.Second || got.Handover != 0 || got.Incarnation != 0 {
						t.Fatalf("Get after the upgrade = %+v, %v; want revision 7, lease 1s, no handover token and no incarnation", got, err)
					}
					ch := sub(t, checker)
					r, err := checker.Heartbeat(ctx, got, heartbeat.Record{Election: "e", Leader: "b", Term: 4, Handover: 9, Incarnation: heartbeat.MaxToken})
					if err != nil || r.Handover != 9 || r.Incarnation != heartbeat.MaxToken {
						t.Fatalf("a handover after the upgrade: %+v, %v", r, err)
					}
					if n := recv(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
						t.Fatalf("notification %v %+v, want %+v", n.Type, n.Record, r)
					}
					checkOlderPresence(t, checker, "e", "n")
				})
			}
		})
	}

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

	t.Run("a vacancy written by an older version keeps the handover token: read as none", func(t *testing.T) {
		opts := Options{Table: uniqueName(t)}
		b := open(t, pool, "e", opts)
		r, err := b.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Leader: "a", Term: 1, Handover: 5})
		if err != nil || r.Handover != 5 {
			t.Fatalf("handover: %+v, %v", r, err)
		}
		// What an older version's UPDATE does: it does not know handover.
		mustExec(t, pool, "UPDATE "+pgx.Identifier{"public", opts.Table}.Sanitize()+
			" SET leader = '', revision = revision + 1 WHERE election = 'e'")
		got, err := b.Get(ctx)
		if err != nil || !got.Vacant() || got.Handover != 0 || got.Revision != r.Revision+1 {
			t.Fatalf("Get = %+v, %v; want a vacant record without a handover token", got, err)
		}
	})

	t.Run("a vacancy written by an older version keeps the incarnation: read as none", func(t *testing.T) {
		opts := Options{Table: uniqueName(t)}
		b := open(t, pool, "e", opts)
		r, err := b.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Leader: "a", Term: 1, Incarnation: 5})
		if err != nil || r.Incarnation != 5 {
			t.Fatalf("claim: %+v, %v", r, err)
		}
		// What an older version's UPDATE does: it does not know incarnation.
		mustExec(t, pool, "UPDATE "+pgx.Identifier{"public", opts.Table}.Sanitize()+
			" SET leader = '', revision = revision + 1 WHERE election = 'e'")
		got, err := b.Get(ctx)
		if err != nil || !got.Vacant() || got.Incarnation != 0 || got.Revision != r.Revision+1 {
			t.Fatalf("Get = %+v, %v; want a vacant record without an incarnation", got, err)
		}
	})

	t.Run("a reserved vacancy claimed by an older version (successor left in place) reads with no successor", func(t *testing.T) {
		opts := Options{Table: uniqueName(t)}
		b := open(t, pool, "e", opts)
		r, err := b.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Term: 1, Successor: "b"})
		if err != nil || r.Successor != "b" {
			t.Fatalf("reserved vacancy: %+v, %v", r, err)
		}
		// What an older version's claim does: it does not know successor.
		mustExec(t, pool, "UPDATE "+pgx.Identifier{"public", opts.Table}.Sanitize()+
			" SET leader = 'c', term = 2, revision = revision + 1 WHERE election = 'e'")
		got, err := b.Get(ctx)
		if err != nil || got.Leader != "c" || got.Successor != "" {
			t.Fatalf("Get = %+v, %v; want leader c and no successor", got, err)
		}
	})

	t.Run("a table with the row-level trigger of an older version is upgraded", func(t *testing.T) {
		opts := Options{Table: uniqueName(t), ChannelPrefix: "lf_up"}
		quoted := pgx.Identifier{"public", opts.Table}.Sanitize()
		old := pgx.Identifier{"public", opts.Table + "_old_notify"}.Sanitize()
		mustExec(t, pool, "CREATE TABLE "+quoted+` (election text PRIMARY KEY, leader text NOT NULL DEFAULT '',
			term bigint NOT NULL DEFAULT 0, revision bigint NOT NULL, ts timestamptz NOT NULL DEFAULT clock_timestamp(),
			value bytea NOT NULL DEFAULT ''::bytea, lease_us bigint NOT NULL DEFAULT 0, successor text NOT NULL DEFAULT '',
			handover bigint NOT NULL DEFAULT 0, incarnation bigint NOT NULL DEFAULT 0, joined timestamptz)`)
		mustExec(t, pool, "CREATE FUNCTION "+old+"() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM pg_notify(TG_NAME, 'old'); RETURN NULL; END$$")
		mustExec(t, pool, "CREATE TRIGGER lf_up AFTER INSERT OR UPDATE OR DELETE ON "+quoted+" FOR EACH ROW EXECUTE FUNCTION "+old+"()")
		checker, _ := NewStore(pool, Options{Table: opts.Table, ChannelPrefix: opts.ChannelPrefix, NoCreate: true})
		defer checker.Close()
		if err := checker.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !strings.Contains(err.Error(), "lf_up_ins") {
			t.Fatalf("NoCreate on a table with the row-level trigger: %v, want ErrInvalidConfig naming lf_up_ins", err)
		}
		s := openStore(t, pool, opts)
		if ok, err := triggerExists(ctx, pool, "public", opts.Table, "lf_up"); err != nil || ok {
			t.Fatalf("row-level trigger after the upgrade: exists %v, %v", ok, err)
		}
		if err := checker.Create(ctx); err != nil {
			t.Fatalf("NoCreate check after the upgrade: %v", err)
		}
		ch := sub(t, s)
		r, err := s.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "a", Term: 1})
		if err != nil {
			t.Fatal(err)
		}
		if n := recv(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
			t.Fatalf("after the upgrade: %v %+v, want %+v", n.Type, n.Record, r)
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
	for i := range 192 {
		last = hb(t, b, last, "a", uint64(i+1), nil)
	}
	var prev uint64
	for prev < last.Revision {
		n := recv(t, ch)
		if n.Type != backend.RecordChanged || n.Record.Revision <= prev {
			t.Fatalf("%v revision %d after %d", n.Type, n.Record.Revision, prev)
		}
		prev = n.Record.Revision
	}
}
