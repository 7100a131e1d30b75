package rethink_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
	"github.com/leaderfeed/leaderfeed/rethink"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

const table = "elections"

// none is the expected record of a first write: no record exists.
var none heartbeat.Record

func rec(leader string, term uint64, value string) heartbeat.Record {
	var v []byte
	if value != "" {
		v = []byte(value)
	}
	return heartbeat.Record{Leader: leader, Term: term, Value: v}
}

// invalid lists constructor calls that must fail with ErrInvalidConfig.
func invalid(s *r.Session) map[string]func() (backend.Election, error) {
	mk := func(session *r.Session, election string, o rethink.Options) func() (backend.Election, error) {
		return func() (backend.Election, error) {
			b, err := rethink.New(session, election, o)
			if b == nil {
				return nil, err // no typed nil in the interface
			}
			return b, err
		}
	}
	return map[string]func() (backend.Election, error){
		"nil session":                mk(nil, "e", rethink.Options{}),
		"empty election name":        mk(s, "", rethink.Options{}),
		"election name too long":     mk(s, strings.Repeat("e", heartbeat.MaxNameLen+1), rethink.Options{}),
		"election name with control": mk(s, "a\nb", rethink.Options{}),
		"database with a dot":        mk(s, "e", rethink.Options{Database: "a.b"}),
		"database with a space":      mk(s, "e", rethink.Options{Database: "a b"}),
		"database too long":          mk(s, "e", rethink.Options{Database: strings.Repeat("d", rethink.MaxTableNameLen+1)}),
		"system database":            mk(s, "e", rethink.Options{Database: "rethinkdb"}),
		"table with a slash":         mk(s, "e", rethink.Options{Table: "a/b"}),
		"table with unicode":         mk(s, "e", rethink.Options{Table: "tablé"}),
		"table too long":             mk(s, "e", rethink.Options{Table: strings.Repeat("t", rethink.MaxTableNameLen+1)}),
	}
}

func TestNewInvalid(t *testing.T) {
	// No server needed: names are checked without touching it.
	for name, f := range invalid(&r.Session{}) {
		t.Run(name, func(t *testing.T) {
			b, err := f()
			if !errors.Is(err, base.ErrInvalidConfig) || b != nil {
				t.Fatalf("got (%v, %v), want no backend and an error matching ErrInvalidConfig", b, err)
			}
			if !strings.HasPrefix(err.Error(), "rethink: ") {
				t.Errorf("error %q lacks the prefix %q", err, "rethink: ")
			}
		})
	}
	st, err := rethink.NewStore(&r.Session{}, rethink.Options{Database: "My-db_1", Table: "T-2"})
	if err != nil || st.Database() != "My-db_1" || st.Table() != "T-2" {
		t.Fatalf("valid names refused: %v", err)
	}
	st, _ = rethink.NewStore(&r.Session{}, rethink.Options{})
	if st.Database() != rethink.DefaultDatabase || st.Table() != rethink.DefaultTable {
		t.Fatalf("defaults: got %s.%s", st.Database(), st.Table())
	}
	if st, err := rethink.NewStore(nil, rethink.Options{}); st != nil || !errors.Is(err, base.ErrInvalidConfig) {
		t.Fatalf("NewStore with a nil session: got (%v, %v), want ErrInvalidConfig", st, err)
	}
}

// TestStoreInvalidElection: the Store checks the election names it is
// given before any I/O (no server needed), for every verb.
func TestStoreInvalidElection(t *testing.T) {
	st, err := rethink.NewStore(&r.Session{}, rethink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"", strings.Repeat("e", heartbeat.MaxNameLen+1), "a\nb", "\xff"} {
		if _, err := st.Get(ctx, name); !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("Get(%q): got %v, want ErrInvalidConfig", name, err)
		}
		next := rec("a", 1, "")
		next.Election = name
		if _, err := st.Heartbeat(ctx, none, next); !errors.Is(err, base.ErrInvalidConfig) {
			t.Errorf("Heartbeat of %q: got %v, want ErrInvalidConfig", name, err)
		}
		res, err := st.HeartbeatBatch(ctx, []backend.Write{{Next: next}})
		if err != nil || len(res) != 1 || !errors.Is(res[0].Err, base.ErrInvalidConfig) {
			t.Errorf("HeartbeatBatch of %q: got %v, %v, want one result with ErrInvalidConfig", name, res, err)
		}
	}
}

func TestCreateMissing(t *testing.T) {
	s := connect(t)
	ctx := testCtx(t)
	missing := unique(t, "nodb")
	noCreate := func(db, tb string) *rethink.Store {
		b, err := rethink.NewStore(s, rethink.Options{Database: db, Table: tb, NoCreate: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	b := noCreate(missing, table)
	if err := b.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := b.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Create with a missing database and NoCreate: got %v, want ErrInvalidConfig and ErrRefused naming %s", err, missing)
	}
	// The server's own "does not exist" is a refusal too, with the fix:
	// retrying cannot make the database.
	if _, err := b.Get(ctx, "e"); !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "does not exist") ||
		!strings.Contains(err.Error(), "fix: let Create make") {
		t.Fatalf("Get in a missing database: got %v, want ErrRefused with the fix", err)
	}
	if _, err := b.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "a", Term: 1, Lease: time.Second}); !errors.Is(err, base.ErrRefused) {
		t.Fatalf("Heartbeat in a missing database: got %v, want ErrRefused", err)
	}
	var exists bool
	if cur, err := r.DBList().Contains(missing).Run(s); err != nil || cur.One(&exists) != nil || exists {
		t.Fatalf("Create with NoCreate: the database %s exists afterwards (%v)", missing, err)
	}

	db := newDatabase(t)
	b2 := noCreate(db, table)
	if err := b2.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), db+"."+table) {
		t.Fatalf("Create with a missing table and NoCreate: got %v, want ErrInvalidConfig and ErrRefused naming %s.%s", err, db, table)
	}
	if _, err := b2.Get(ctx, "e"); !errors.Is(err, base.ErrRefused) || !strings.Contains(err.Error(), "Table `"+db+"."+table+"` does not exist") {
		t.Fatalf("Get in a missing table: got %v, want ErrRefused naming the table", err)
	}
	if _, err := r.DB(db).TableCreate(table).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	if err := b2.Create(ctx); err != nil {
		t.Fatalf("Create with NoCreate, database and table present: %v", err)
	}

	// A table with another primary key cannot hold the election documents.
	if _, err := r.DB(db).TableCreate("otherpk", r.TableCreateOpts{PrimaryKey: "name"}).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	b3, _ := rethink.NewStore(s, rethink.Options{Database: db, Table: "otherpk"})
	defer b3.Close()
	if err := b3.Create(ctx); !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, base.ErrRefused) {
		t.Fatalf("Create on a table with primary key \"name\": got %v, want ErrInvalidConfig and ErrRefused", err)
	}
}

// TestCreateConcurrent races creators, each with a session of its own, on a
// database that does not exist yet; the zero Options create what is
// missing. On a real RethinkDB 2.4.4 such a race made duplicate databases
// and tables before Create resolved them (see plan.go); reqlite runs one
// query at a time and never makes duplicates, so there this checks that
// racing creators all succeed and leave one usable table. The resolution
// itself is tested against a fake catalog in plan_test.go.
func TestCreateConcurrent(t *testing.T) {
	s := connect(t)
	ctx := testCtx(t)
	db := unique(t, "mk")
	t.Cleanup(func() { _, _ = r.DBDrop(db).RunWrite(s) })
	const creators = 8
	var wg sync.WaitGroup
	errs := make([]error, creators)
	for i := range errs {
		b, err := rethink.NewStore(connect(t), rethink.Options{Database: db, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		wg.Go(func() {
			// Not serialized: racing creators must all succeed.
			errs[i] = b.Create(ctx)
			if errs[i] == nil {
				errs[i] = b.Create(ctx) // idempotent
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("creator %d: %v", i, err)
		}
	}
	// One database and one table of the names: queries naming them work
	// (with duplicates they fail as ambiguous), and the system tables, on
	// a server that fills them, list one of each.
	if _, err := r.DB(db).Table(table).Count().Run(s); err != nil {
		t.Fatalf("querying %s.%s after the race: %v", db, table, err)
	}
	var dbs, tables []map[string]any
	if cur, err := r.DB("rethinkdb").Table("db_config").Filter(map[string]any{"name": db}).Run(s); err != nil || cur.All(&dbs) != nil {
		t.Fatalf("reading db_config: %v", err)
	}
	if cur, err := r.DB("rethinkdb").Table("table_config").Filter(map[string]any{"db": db, "name": table}).Run(s); err != nil || cur.All(&tables) != nil {
		t.Fatalf("reading table_config: %v", err)
	}
	switch {
	case server.reqlite && len(dbs) == 0 && len(tables) == 0:
		t.Log("reqlite: its system tables are empty; only the query by name could be checked")
	case len(dbs) != 1 || len(tables) != 1:
		t.Fatalf("after the race: %d databases and %d tables named %s.%s, want one of each", len(dbs), len(tables), db, table)
	}
}

func TestHeartbeatCompareAndSet(t *testing.T) {
	db := newDatabase(t)
	a := open(t, nil, db, table, "cas")
	bb := open(t, nil, db, table, "cas")
	ctx := testCtx(t)

	if _, err := a.Get(ctx); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Get before any write: got %v, want ErrNotFound", err)
	}
	before := time.Now()
	r1, err := a.Heartbeat(ctx, none, rec("a", 1, "addr-a"))
	if err != nil {
		t.Fatalf("first claim: %v", err)
	}
	if r1.Election != "cas" || r1.Leader != "a" || r1.Term != 1 || r1.Revision != 1 || string(r1.Value) != "addr-a" {
		t.Fatalf("first claim stored %v value %q", r1, r1.Value)
	}
	if d := r1.Timestamp.Sub(before); d < -time.Minute || d > time.Minute {
		t.Errorf("store timestamp %v is far from the local clock %v", r1.Timestamp, before)
	}

	// A second first claim conflicts and carries the current record.
	_, err = bb.Heartbeat(ctx, none, rec("b", 1, ""))
	var ce *backend.ConflictError
	if !errors.Is(err, backend.ErrConflict) || !errors.As(err, &ce) || !ce.Current.Equal(r1) {
		t.Fatalf("second first claim: got %v, want a conflict carrying %v", err, r1)
	}

	r2, err := a.Heartbeat(ctx, r1, rec("a", 1, "addr-a"))
	if err != nil || r2.Revision != 2 || r2.Term != 1 || r2.Timestamp.Before(r1.Timestamp) {
		t.Fatalf("renewal: got %v, %v", r2, err)
	}
	// A claim on a stale revision fails.
	if _, err := bb.Heartbeat(ctx, r1, rec("b", 2, "")); !errors.As(err, &ce) || ce.Current.Revision != 2 {
		t.Fatalf("stale claim: got %v, want a conflict at revision 2", err)
	}
	// The stored revision with another leader or term is another write
	// (a store that lost a write can hand a revision out twice).
	for _, other := range []heartbeat.Record{{Revision: 2, Leader: "b", Term: 1}, {Revision: 2, Leader: "a", Term: 2}, {Revision: 2, Term: 1}} {
		if _, err := bb.Heartbeat(ctx, other, rec("b", 2, "")); !errors.As(err, &ce) || !ce.Current.Equal(r2) {
			t.Fatalf("claim expecting %v on %v: got %v, want a conflict carrying it", other, r2, err)
		}
	}
	// Vacant, then claimed by b with a higher term.
	r3, err := a.Heartbeat(ctx, r2, rec("", 1, ""))
	if err != nil || !r3.Vacant() || r3.Value != nil || r3.Revision != 3 {
		t.Fatalf("resign: got %v, %v", r3, err)
	}
	r4, err := bb.Heartbeat(ctx, r3, rec("b", 2, "addr-b"))
	if err != nil || r4.Leader != "b" || r4.Revision != 4 {
		t.Fatalf("claim after vacancy: got %v, %v", r4, err)
	}
	got, err := a.Get(ctx)
	if err != nil || !got.Equal(r4) {
		t.Fatalf("Get: got %v (%v), want %v", got, err, r4)
	}
	// A claim on a revision that does not exist yet fails too.
	future := r4
	future.Revision = 99
	if _, err := a.Heartbeat(ctx, future, rec("a", 3, "")); !errors.As(err, &ce) || ce.Current.Revision != 4 {
		t.Fatalf("claim on a future revision: got %v", err)
	}
	// Invalid records are refused before any write.
	if _, err := a.Heartbeat(ctx, r4, rec("", 3, "value-without-leader")); !errors.Is(err, heartbeat.ErrInvalidRecord) {
		t.Fatalf("vacant record with a value: got %v, want ErrInvalidRecord", err)
	}
	big := bytes.Repeat([]byte("x"), heartbeat.MaxValueLen)
	r5, err := bb.Heartbeat(ctx, r4, heartbeat.Record{Leader: "b", Term: 2, Value: big})
	if err != nil || !bytes.Equal(r5.Value, big) {
		t.Fatalf("largest value: %v", err)
	}
}

// TestConcurrentClaimants races several nodes, each with a session of its
// own. On reqlite the writes are serialized by the harness (see writeMu),
// so this checks the logic, not the store's atomicity.
func TestConcurrentClaimants(t *testing.T) {
	db := newDatabase(t)
	const n = 8
	nodes := make([]backend.Election, n)
	for i := range nodes {
		nodes[i] = open(t, nil, db, table, "race")
	}
	ctx := testCtx(t)
	var expected heartbeat.Record
	for round := range 3 {
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners []heartbeat.Record
		)
		for i, b := range nodes {
			wg.Go(func() {
				got, err := b.Heartbeat(ctx, expected, rec(fmt.Sprintf("n%d", i), uint64(round+1), ""))
				switch {
				case err == nil:
					mu.Lock()
					winners = append(winners, got)
					mu.Unlock()
				case !errors.Is(err, backend.ErrConflict):
					t.Errorf("round %d node %d: %v", round, i, err)
				}
			})
		}
		wg.Wait()
		if len(winners) != 1 {
			t.Fatalf("round %d: %d winners %v, want exactly one", round, len(winners), winners)
		}
		expected = winners[0]
	}
}

// next receives one notification, failing after a while.
func next(t *testing.T, ch <-chan backend.Notification) backend.Notification {
	t.Helper()
	select {
	case n, ok := <-ch:
		if !ok {
			t.Fatal("feed closed")
		}
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no notification in 10 s")
	}
	return backend.Notification{}
}

// TestFeedOrder: the store's changefeed delivers every write of every
// election, in commit order per election, and coalesces nothing (base does
// that).
func TestFeedOrder(t *testing.T) {
	db := newDatabase(t)
	w := open(t, nil, db, table, "order")
	obs := openStore(t, nil, db, table)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	ch, err := obs.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const writes = 30
	var last heartbeat.Record
	for i := range writes {
		got, err := w.Heartbeat(ctx, last, rec("w", 1, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		last = got
	}
	for i := range writes {
		n := next(t, ch)
		if n.Type != backend.RecordChanged || n.Record.Revision != uint64(i+1) || string(n.Record.Value) != fmt.Sprint(i) {
			t.Fatalf("notification %d: %v %v, want revision %d", i, n.Type, n.Record, i+1)
		}
		if n.Record.Timestamp.IsZero() || n.Record.Election != "order" {
			t.Fatalf("notification %d lacks timestamp or election: %v", i, n.Record)
		}
	}
	cancel()
	for n := range ch {
		if n.Type == backend.Failed {
			t.Fatalf("cancelled feed sent Failed: %v", n.Err)
		}
	}
}

func TestChangeEvents(t *testing.T) {
	db := newDatabase(t)
	b := openStore(t, nil, db, table)
	s := connect(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	ch, err := b.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// An election document is an election's record, never the
	// application's data.
	other := open(t, nil, db, table, "another-election")
	r1, err := other.Heartbeat(ctx, none, rec("x", 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	if n := next(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(r1) {
		t.Fatalf("election write: got %v %v, want RecordChanged %v", n.Type, n.Record, r1)
	}
	tb := r.DB(db).Table(table)
	steps := []r.Term{
		tb.Insert(map[string]any{"id": "job-1", "state": "new"}),
		tb.Get("job-1").Update(map[string]any{"state": "done"}),
		tb.Insert(map[string]any{"id": 42, "n": 1}),
		tb.Get("job-1").Delete(),
		tb.Get(42).Replace(map[string]any{"id": 42, "n": 2}),
	}
	for _, q := range steps {
		if _, err := q.RunWrite(s); err != nil {
			t.Fatal(err)
		}
	}
	want := []struct {
		op       backend.Op
		key      string
		old, new string
	}{
		{backend.Insert, `"job-1"`, ``, `{"id":"job-1","state":"new"}`},
		{backend.Update, `"job-1"`, `{"id":"job-1","state":"new"}`, `{"id":"job-1","state":"done"}`},
		{backend.Insert, `42`, ``, `{"id":42,"n":1}`},
		{backend.Delete, `"job-1"`, `{"id":"job-1","state":"done"}`, ``},
		{backend.Update, `42`, `{"id":42,"n":1}`, `{"id":42,"n":2}`},
	}
	for i, w := range want {
		n := next(t, ch)
		c := n.Change
		if n.Type != backend.OtherChanged || c.Op != w.op || c.Table != table || string(c.Key) != w.key ||
			!jsonEqual(c.Old, w.old) || !jsonEqual(c.New, w.new) {
			t.Fatalf("change %d: got %v %v key=%s old=%s new=%s, want %v key=%s old=%s new=%s",
				i, n.Type, c.Op, c.Key, c.Old, c.New, w.op, w.key, w.old, w.new)
		}
	}
}

func jsonEqual(got json.RawMessage, want string) bool {
	if want == "" {
		return got == nil
	}
	var a, b any
	if json.Unmarshal(got, &a) != nil || json.Unmarshal([]byte(want), &b) != nil {
		return false
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// malformedDocs are documents with an election's id that the backend must
// refuse to decode.
func malformedDocs(election string) map[string]map[string]any {
	now := r.Now()
	good := func(change map[string]any) map[string]any {
		d := map[string]any{"id": election, "leaderfeed": 1, "leader": "x", "term": 1, "revision": 1, "timestamp": now, "value": nil}
		for k, v := range change {
			if v == nil {
				delete(d, k)
			} else {
				d[k] = v
			}
		}
		return d
	}
	return map[string]map[string]any{
		"foreign (no mark)":      good(map[string]any{"leaderfeed": nil}),
		"other format":           good(map[string]any{"leaderfeed": 2}),
		"leader not a string":    good(map[string]any{"leader": 7}),
		"missing leader":         good(map[string]any{"leader": nil}),
		"missing revision":       good(map[string]any{"revision": nil}),
		"revision zero":          good(map[string]any{"revision": 0}),
		"negative term":          good(map[string]any{"term": -1}),
		"fractional term":        good(map[string]any{"term": 1.5}),
		"term a string":          good(map[string]any{"term": "1"}),
		"timestamp a string":     good(map[string]any{"timestamp": "2024-01-01"}),
		"missing timestamp":      good(map[string]any{"timestamp": nil}),
		"value a string":         good(map[string]any{"value": "addr"}),
		"vacant with a value":    good(map[string]any{"leader": "", "value": r.Binary([]byte("v"))}),
		"leader with control":    good(map[string]any{"leader": "a\x01"}),
		"lease a string":         good(map[string]any{"lease_us": "1000"}),
		"negative lease":         good(map[string]any{"lease_us": -1}),
		"fractional lease":       good(map[string]any{"lease_us": 1.5}),
		"lease too long":         good(map[string]any{"lease_us": heartbeat.MaxLease.Microseconds() + 1}),
		"lease a binary":         good(map[string]any{"lease_us": r.Binary([]byte("1"))}),
		"handover a string":      good(map[string]any{"handover": "7"}),
		"negative handover":      good(map[string]any{"handover": -1}),
		"fractional handover":    good(map[string]any{"handover": 1.5}),
		"handover too big":       good(map[string]any{"handover": heartbeat.MaxToken + 1}),
		"vacant, handover -1":    good(map[string]any{"leader": "", "handover": -1}),
		"incarnation a string":   good(map[string]any{"incarnation": "7"}),
		"negative incarnation":   good(map[string]any{"incarnation": -1}),
		"fractional incarnation": good(map[string]any{"incarnation": 1.5}),
		"incarnation too big":    good(map[string]any{"incarnation": heartbeat.MaxToken + 1}),
		"vacant, incarnation -1": good(map[string]any{"leader": "", "incarnation": -1}),
	}
}

func TestMalformed(t *testing.T) {
	db := newDatabase(t)
	s := connect(t)
	tb := r.DB(db).Table(table)
	for name, doc := range malformedDocs("bad") {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			b := open(t, nil, db, table, "bad")
			st := openStore(t, nil, db, table)
			ch, err := st.Subscribe(ctx)
			if err != nil {
				t.Fatal(err)
			}
			foreign := doc["leaderfeed"] == nil
			if foreign {
				// Without the mark, the document is the application's
				// (OtherChanged), until it replaces an election
				// document: then the election's record is malformed.
				if err := insertMarked(ctx, tb, s); err != nil {
					t.Fatal(err)
				}
				if n := next(t, ch); n.Type != backend.RecordChanged {
					t.Fatalf("feed: got %v (%v), want RecordChanged", n.Type, n.Err)
				}
			}
			if _, err := tb.Insert(doc, r.InsertOpts{Conflict: "replace"}).RunWrite(s); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Get(ctx); !errors.Is(err, backend.ErrMalformedRecord) {
				t.Fatalf("Get: got %v, want ErrMalformedRecord", err)
			}
			if n := next(t, ch); n.Type != backend.Ignored || n.Election != "bad" || !errors.Is(n.Err, backend.ErrMalformedRecord) {
				t.Fatalf("feed: got %v %q (%v), want Ignored of \"bad\" with ErrMalformedRecord", n.Type, n.Election, n.Err)
			}
			// A claim on it is refused with the reason, not a conflict,
			// even on its own revision: a ConflictError never carries a
			// malformed record, and nothing overwrites it.
			for _, expected := range []heartbeat.Record{none, {Revision: 1, Leader: "x", Term: 1}, {Revision: 99, Leader: "x", Term: 1}} {
				_, err := b.Heartbeat(ctx, expected, rec("me", 5, ""))
				if !errors.Is(err, backend.ErrMalformedRecord) || errors.Is(err, backend.ErrConflict) {
					t.Fatalf("Heartbeat(%v) over a malformed document: got %v, want ErrMalformedRecord", expected, err)
				}
			}
			// The feed goes on: deletion, then a good record.
			if _, err := tb.Get("bad").Delete().RunWrite(s); err != nil {
				t.Fatal(err)
			}
			switch n := next(t, ch); {
			case foreign && (n.Type != backend.OtherChanged || n.Change.Op != backend.Delete):
				t.Fatalf("after delete of a foreign document: got %v %v (%v), want OtherChanged delete", n.Type, n.Change.Op, n.Err)
			case !foreign && (n.Type != backend.RecordDeleted || n.Election != "bad"):
				t.Fatalf("after delete: got %v %q (%v), want RecordDeleted of \"bad\"", n.Type, n.Election, n.Err)
			}
			got, err := b.Heartbeat(ctx, none, rec("me", 1, ""))
			if err != nil {
				t.Fatal(err)
			}
			if n := next(t, ch); n.Type != backend.RecordChanged || !n.Record.Equal(got) {
				t.Fatalf("after a good write: got %v %v, want RecordChanged %v", n.Type, n.Record, got)
			}
			if _, err := tb.Get("bad").Delete().RunWrite(s); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// insertMarked inserts a well-formed election document "bad".
func insertMarked(ctx context.Context, tb r.Term, s *r.Session) error {
	doc := map[string]any{"id": "bad", "leaderfeed": 1, "leader": "x", "term": 1, "revision": 1, "timestamp": r.Now(), "value": nil}
	_, err := tb.Insert(doc, r.InsertOpts{Conflict: "replace"}).RunWrite(s, r.RunOpts{Context: ctx})
	return err
}

func TestCancelledContext(t *testing.T) {
	db := newDatabase(t)
	b := open(t, nil, db, table, "ctx")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	checks := map[string]error{}
	checks["Start"] = b.Start(ctx)
	checks["Create"] = b.Create(ctx)
	_, checks["Get"] = b.Get(ctx)
	_, checks["Heartbeat"] = b.Heartbeat(ctx, none, rec("a", 1, ""))
	_, checks["Subscribe"] = b.Subscribe(ctx)
	for name, err := range checks {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: got %v, want context.Canceled", name, err)
		}
	}
	// Nothing was written.
	if _, err := b.Get(testCtx(t)); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("after a cancelled Heartbeat: Get got %v, want ErrNotFound", err)
	}
	// A deadline that expires while the query runs.
	dctx, dcancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer dcancel()
	<-dctx.Done()
	if _, err := b.Get(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get after the deadline: got %v, want DeadlineExceeded", err)
	}
	// A subscription whose context is cancelled closes without Failed.
	sctx, scancel := context.WithCancel(testCtx(t))
	ch, err := b.Subscribe(sctx)
	if err != nil {
		t.Fatal(err)
	}
	scancel()
	for n := range ch {
		if n.Type == backend.Failed {
			t.Fatalf("cancelled subscription sent Failed: %v", n.Err)
		}
	}
}

func TestClose(t *testing.T) {
	db := newDatabase(t)
	s := connect(t)
	st, err := rethink.NewStore(s, rethink.Options{Database: db, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	b, err := base.Open(st, "close")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if err := b.Create(ctx); err != nil {
		t.Fatal(err)
	}
	ch, err := b.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for range ch { // closes; no Failed is required, but nothing blocks
	}
	checks := map[string]error{}
	checks["Start"] = b.Start(ctx)
	checks["Create"] = b.Create(ctx)
	_, checks["Get"] = b.Get(ctx)
	_, checks["Heartbeat"] = b.Heartbeat(ctx, none, rec("a", 1, ""))
	_, checks["Subscribe"] = b.Subscribe(ctx)
	for name, err := range checks {
		if !errors.Is(err, base.ErrClosed) {
			t.Errorf("%s after Close: got %v, want ErrClosed", name, err)
		}
	}
	// Closing the Backend of base.Open closed its Store.
	stChecks := map[string]error{}
	stChecks["Start"] = st.Start(ctx)
	stChecks["Create"] = st.Create(ctx)
	_, stChecks["Get"] = st.Get(ctx, "close")
	_, stChecks["Heartbeat"] = st.Heartbeat(ctx, none, heartbeat.Record{Election: "close", Leader: "a", Term: 1})
	_, stChecks["HeartbeatBatch"] = st.HeartbeatBatch(ctx, []backend.Write{{Next: heartbeat.Record{Election: "close", Leader: "a", Term: 1}}})
	_, stChecks["Subscribe"] = st.Subscribe(ctx)
	for name, err := range stChecks {
		if !errors.Is(err, base.ErrClosed) {
			t.Errorf("Store.%s after Close: got %v, want ErrClosed", name, err)
		}
	}
	// The caller's session is still open.
	if _, err := r.Expr(1).Run(s); err != nil {
		t.Fatalf("session closed by the backend: %v", err)
	}
}

// TestServerRestart kills the server under an open subscription (a proxy
// closes every connection and stops listening) and brings it back.
func TestServerRestart(t *testing.T) {
	db := newDatabase(t)
	p := newProxy(t, server.addr)
	s := connectTo(t, p.addr)
	b := open(t, s, db, table, "restart")
	writer := open(t, nil, db, table, "restart")
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	ch, err := b.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := writer.Heartbeat(ctx, none, rec("w", 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	if n := next(t, ch); n.Type != backend.RecordChanged || n.Record.Revision != 1 {
		t.Fatalf("before the kill: got %v", n.Type)
	}

	p.Kill()
	n := next(t, ch)
	if n.Type != backend.Failed || n.Err == nil {
		t.Fatalf("after the kill: got %v, want Failed", n.Type)
	}
	t.Logf("Failed: %v", n.Err)
	if _, ok := <-ch; ok {
		t.Fatal("the feed sent something after Failed")
	}
	if _, err := b.Subscribe(ctx); err == nil {
		t.Fatal("Subscribe succeeded while the server is down")
	}

	p.Restart()
	// The driver reconnects on the next query; the first ones may still
	// see the dead connection.
	var ch2 <-chan backend.Notification
	deadline := time.Now().Add(10 * time.Second)
	for {
		ch2, err = b.Subscribe(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Subscribe after the restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r2, err := writer.Heartbeat(ctx, r1, rec("w", 1, ""))
	if err != nil {
		t.Fatal(err)
	}
	if n := next(t, ch2); n.Type != backend.RecordChanged || !n.Record.Equal(r2) {
		t.Fatalf("after the restart: got %v %v, want %v", n.Type, n.Record, r2)
	}
	if _, err := b.Heartbeat(ctx, r2, rec("b", 2, "")); err != nil {
		t.Fatalf("Heartbeat through the restarted server: %v", err)
	}
}

// messages is a slog.Handler that keeps the messages logged.
type messages struct {
	mu   sync.Mutex
	msgs []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) WithAttrs([]slog.Attr) slog.Handler       { return m }
func (m *messages) WithGroup(string) slog.Handler            { return m }
func (m *messages) Handle(_ context.Context, rec slog.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.msgs = append(m.msgs, rec.Message)
	return nil
}

func (m *messages) has(prefix string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.ContainsFunc(m.msgs, func(s string) bool { return strings.HasPrefix(s, prefix) })
}

// TestCreateSoftDurability: a table configured with durability "soft"
// acknowledges writes before they reach disk. The election writes ask for
// hard durability themselves, so Create warns instead of refusing. reqlite
// cannot report a table's configuration (empty system tables): there
// Create says at Debug that it skipped the check.
func TestCreateSoftDurability(t *testing.T) {
	db := newDatabase(t)
	s := connect(t)
	if _, err := r.DB(db).TableCreate(table, r.TableCreateOpts{Durability: "soft"}).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	log := &messages{}
	b, err := rethink.NewStore(s, rethink.Options{Database: db, Table: table, NoCreate: true, Logger: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Create(testCtx(t)); err != nil {
		t.Fatalf("Create on a soft table: %v", err)
	}
	switch {
	case server.reqlite:
		if !log.has("rethink: the system tables do not list the database") {
			t.Fatalf("reqlite: logged %q, want the message that the checks were skipped", log.msgs)
		}
	case !log.has("rethink: table durability is soft"):
		t.Fatalf("logged %q, want a warning about durability soft", log.msgs)
	}
	// The election's own writes work (with hard durability).
	w := wrapWrites(b)
	next := rec("a", 1, "")
	next.Election = "soft"
	if _, err := w.Heartbeat(testCtx(t), none, next); err != nil {
		t.Fatal(err)
	}
}

// TestLease: the lease is stored in whole microseconds, rounded up, and a
// document written before the field existed (no lease_us) is a record with
// Lease 0 that a compare-and-set takes over like any other. A vacant
// document that still holds a lease (an older writer merged a vacancy into
// a leased document) is vacant with Lease 0, not malformed.
func TestLease(t *testing.T) {
	db := newDatabase(t)
	b := open(t, nil, db, table, "lease")
	s := connect(t)
	ctx := testCtx(t)
	tb := r.DB(db).Table(table)

	next := rec("a", 1, "")
	next.Lease = 1500*time.Millisecond + 250*time.Microsecond + 1 // rounded up
	want := 1500*time.Millisecond + 251*time.Microsecond
	r1, err := b.Heartbeat(ctx, none, next)
	if err != nil || r1.Lease != want {
		t.Fatalf("Heartbeat with lease %v: got %v (lease %v), %v; want lease %v", next.Lease, r1, r1.Lease, err, want)
	}
	raw, err := tb.Get("lease").Field("lease_us").Run(s)
	if err != nil {
		t.Fatal(err)
	}
	var us int64
	if err := raw.One(&us); err != nil || us != want.Microseconds() {
		t.Fatalf("stored lease_us %d (%v), want %d", us, err, want.Microseconds())
	}
	_ = raw.Close()

	legacy := map[string]any{"id": "lease", "leaderfeed": 1, "leader": "old", "term": 4, "revision": 7, "timestamp": r.Now(), "value": nil}
	if _, err := tb.Insert(legacy, r.InsertOpts{Conflict: "replace"}).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	old, err := b.Get(ctx)
	if err != nil || old.Leader != "old" || old.Revision != 7 || old.Lease != 0 {
		t.Fatalf("document without a lease: got %v (lease %v), %v; want leader old, revision 7, lease 0", old, old.Lease, err)
	}
	next.Lease = time.Second
	r2, err := b.Heartbeat(ctx, old, next)
	if err != nil || r2.Revision != 8 || r2.Lease != time.Second {
		t.Fatalf("claim over a document without a lease: got %v (lease %v), %v", r2, r2.Lease, err)
	}

	// An older writer's vacancy, merged into the leased document.
	if _, err := tb.Get("lease").Update(map[string]any{"leader": "", "revision": 9, "value": nil}).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	v, err := b.Get(ctx)
	if err != nil || !v.Vacant() || v.Revision != 9 || v.Lease != 0 {
		t.Fatalf("vacant document with a stale lease: got %v (lease %v), %v; want vacant at revision 9 with lease 0", v, v.Lease, err)
	}
	if r3, err := b.Heartbeat(ctx, v, next); err != nil || r3.Revision != 10 {
		t.Fatalf("claim over it: got %v, %v", r3, err)
	}
}

// TestIncarnation: the incarnation is stored as the exact number written,
// MaxToken included; a document written before the field existed (no
// incarnation) is a record with Incarnation 0 that a compare-and-set takes
// over like any other, and so is a vacant document that still holds one
// (an older writer merged a vacancy into it).
func TestIncarnation(t *testing.T) {
	db := newDatabase(t)
	b := open(t, nil, db, table, "inc")
	s := connect(t)
	ctx := testCtx(t)
	tb := r.DB(db).Table(table)

	next := rec("a", 1, "")
	next.Incarnation = heartbeat.MaxToken
	r1, err := b.Heartbeat(ctx, none, next)
	if err != nil || r1.Incarnation != heartbeat.MaxToken {
		t.Fatalf("Heartbeat with incarnation MaxToken: got %+v, %v", r1, err)
	}
	raw, err := tb.Get("inc").Field("incarnation").Run(s)
	if err != nil {
		t.Fatal(err)
	}
	var stored int64
	if err := raw.One(&stored); err != nil || stored != heartbeat.MaxToken {
		t.Fatalf("stored incarnation %d (%v), want %d (MaxToken)", stored, err, int64(heartbeat.MaxToken))
	}
	_ = raw.Close()

	legacy := map[string]any{"id": "inc", "leaderfeed": 1, "leader": "old", "term": 4, "revision": 7, "timestamp": r.Now(), "value": nil,
		"lease_us": 1000, "successor": "", "handover": 0}
	if _, err := tb.Insert(legacy, r.InsertOpts{Conflict: "replace"}).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	old, err := b.Get(ctx)
	if err != nil || old.Leader != "old" || old.Revision != 7 || old.Incarnation != 0 {
		t.Fatalf("document without an incarnation: got %+v, %v; want leader old, revision 7, incarnation 0", old, err)
	}
	next.Incarnation = 5
	r2, err := b.Heartbeat(ctx, old, next)
	if err != nil || r2.Revision != 8 || r2.Incarnation != 5 {
		t.Fatalf("claim over a document without an incarnation: got %+v, %v", r2, err)
	}

	// An older writer's vacancy, merged into the document.
	if _, err := tb.Get("inc").Update(map[string]any{"leader": "", "revision": 9, "value": nil}).RunWrite(s); err != nil {
		t.Fatal(err)
	}
	v, err := b.Get(ctx)
	if err != nil || !v.Vacant() || v.Revision != 9 || v.Incarnation != 0 {
		t.Fatalf("vacant document with a stale incarnation: got %+v, %v; want vacant at revision 9, incarnation 0", v, err)
	}
	next.Incarnation = 0
	if r3, err := b.Heartbeat(ctx, v, next); err != nil || r3.Revision != 10 || r3.Incarnation != 0 {
		t.Fatalf("claim over it: got %+v, %v", r3, err)
	}
}
