package rethink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/leaderfeed/leaderfeed/base"
	r "gopkg.in/rethinkdb/rethinkdb-go.v6"
)

// These tests need no server: they run on every `go test`, in CI too.

func TestPlan(t *testing.T) {
	const db, tb = "lf", "elections"
	dbs := func(ids ...string) []dbRow {
		var rows []dbRow
		for _, id := range ids {
			rows = append(rows, dbRow{ID: id, Name: db})
		}
		return rows
	}
	tbl := func(id, dbID, name string) tableRow {
		return tableRow{ID: id, Name: name, DB: dbID, PrimaryKey: "id", Durability: "hard"}
	}
	cases := []struct {
		name   string
		why    string
		dbs    []dbRow
		tables []tableRow
		create bool
		want   step
	}{
		{
			name: "nothing, create", create: true,
			why:  "a missing database is created first",
			want: step{Action: actCreateDB},
		},
		{
			name: "nothing, no create",
			why:  "with NoCreate a missing database is an error naming it",
			want: step{Action: actMissing, What: "database lf"},
		},
		{
			name: "database, no table, create", create: true, dbs: dbs("a"),
			tables: []tableRow{tbl("t1", "a", "other")},
			why:    "a table of another name is not ours",
			want:   step{Action: actCreateTable},
		},
		{
			name: "database, no table, no create", dbs: dbs("a"),
			why:  "with NoCreate a missing table is an error naming it",
			want: step{Action: actMissing, What: "table lf.elections"},
		},
		{
			name: "one of each", create: true, dbs: dbs("a"),
			tables: []tableRow{tbl("t1", "a", tb), tbl("t2", "a", "other")},
			why:    "exactly one database and one table: use them",
			want:   step{Action: actDone, Keep: "t1", Table: tbl("t1", "a", tb)},
		},
		{
			name: "one of each, no create", dbs: dbs("a"), tables: []tableRow{tbl("t1", "a", tb)},
			why:  "NoCreate does not stop a complete catalog from being used",
			want: step{Action: actDone, Keep: "t1", Table: tbl("t1", "a", tb)},
		},
		{
			name: "duplicate empty databases", create: true, dbs: dbs("c", "a", "b"),
			why:  "every creator keeps the lowest id and drops the others in ascending order",
			want: step{Action: actDropDBs, Keep: "a", Drop: []string{"b", "c"}},
		},
		{
			name: "duplicate databases, no create", dbs: dbs("b", "a"),
			why:  "duplicates are resolved with NoCreate too: the names are unusable otherwise",
			want: step{Action: actDropDBs, Keep: "a", Drop: []string{"b"}},
		},
		{
			name: "duplicate databases, one holds our table", create: true, dbs: dbs("a", "b"),
			tables: []tableRow{tbl("t1", "b", tb)},
			why:    "the database that holds tables wins over an empty duplicate, whatever the ids",
			want:   step{Action: actDropDBs, Keep: "b", Drop: []string{"a"}},
		},
		{
			name: "duplicate databases, the keeper holds the application's tables", create: true, dbs: dbs("a", "b"),
			tables: []tableRow{tbl("t1", "b", "users"), tbl("t2", "b", tb)},
			why:    "the most tables wins; the empty duplicate is dropped",
			want:   step{Action: actDropDBs, Keep: "b", Drop: []string{"a"}},
		},
		{
			name: "duplicate databases, a dropped one would take the application's tables", create: true, dbs: dbs("a", "b"),
			tables: []tableRow{tbl("t1", "a", "users"), tbl("t2", "b", "jobs")},
			why:    "never drop a database holding tables other than ours: refuse and drop nothing",
			want: step{Action: actRefuse, Keep: "a", What: "2 databases are named lf; keeping a would drop b (tables jobs), " +
				"which hold tables other than elections: drop or rename the duplicates by hand (through rethinkdb.db_config)"},
		},
		{
			name: "the same database listed twice", create: true, dbs: dbs("a", "a"), tables: []tableRow{tbl("t1", "a", tb)},
			why:  "a row seen twice is not a duplicate",
			want: step{Action: actDone, Keep: "t1", Table: tbl("t1", "a", tb)},
		},
		{
			name: "duplicate tables", create: true, dbs: dbs("a"),
			tables: []tableRow{tbl("t3", "a", tb), tbl("t1", "a", tb), tbl("t9", "a", "other"), tbl("t2", "a", tb)},
			why:    "keep the lowest id, drop the others in ascending order, leave other tables alone",
			want:   step{Action: actDropTables, Keep: "t1", Drop: []string{"t2", "t3"}},
		},
		{
			name: "duplicate tables, no create", dbs: dbs("a"),
			tables: []tableRow{tbl("t2", "a", tb), tbl("t1", "a", tb)},
			why:    "NoCreate still resolves duplicates",
			want:   step{Action: actDropTables, Keep: "t1", Drop: []string{"t2"}},
		},
		{
			name: "the same table listed twice", create: true, dbs: dbs("a"),
			tables: []tableRow{tbl("t1", "a", tb), tbl("t1", "a", tb)},
			why:    "a row seen twice is not a duplicate",
			want:   step{Action: actDone, Keep: "t1", Table: tbl("t1", "a", tb)},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := plan(db, tb, c.dbs, c.tables, c.create)
			if got.Action != c.want.Action || got.Keep != c.want.Keep || !slices.Equal(got.Drop, c.want.Drop) ||
				!reflect.DeepEqual(got.Table, c.want.Table) || got.What != c.want.What {
				t.Fatalf("%s\ngot  %s keep=%q drop=%v table=%+v what=%q\nwant %s keep=%q drop=%v table=%+v what=%q",
					c.why, got.Action, got.Keep, got.Drop, got.Table, got.What,
					c.want.Action, c.want.Keep, c.want.Drop, c.want.Table, c.want.What)
			}
			// The decision does not depend on the order of the rows.
			rdbs, rtables := slices.Clone(c.dbs), slices.Clone(c.tables)
			slices.Reverse(rdbs)
			slices.Reverse(rtables)
			if again := plan(db, tb, rdbs, rtables, c.create); again.Action != got.Action || again.Keep != got.Keep || !slices.Equal(again.Drop, got.Drop) {
				t.Fatalf("rows in another order give another decision: %s keep=%q drop=%v", again.Action, again.Keep, again.Drop)
			}
		})
	}
}

func TestClassifyDrop(t *testing.T) {
	cases := []struct {
		name string
		res  deleteResult
		err  error
		want dropOutcome
	}{
		{"deleted", deleteResult{Deleted: 1}, nil, dropped},
		{"row missing: another process dropped it", deleteResult{Skipped: 1}, nil, alreadyGone},
		{"server says it does not exist", deleteResult{}, errors.New("rethinkdb: Table `lf.elections` does not exist"), alreadyGone},
		{"write error that it does not exist", deleteResult{Errors: 1, FirstError: "Database `x` does not exist."}, nil, alreadyGone},
		{"permission", deleteResult{}, errors.New("rethinkdb: User `app` does not have the required `config` permission"), dropFailed},
		{"connection lost", deleteResult{}, errors.New("rethinkdb: connection closed"), dropFailed},
		{"other write error", deleteResult{Errors: 1, FirstError: "The server(s) hosting table `x` are currently unreachable."}, nil, dropFailed},
		{"empty result", deleteResult{}, nil, dropFailed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := classifyDrop(c.res, c.err); got != c.want {
				t.Fatalf("classifyDrop(%+v, %v) = %s, want %s", c.res, c.err, got, c.want)
			}
		})
	}
}

func TestUnavailable(t *testing.T) {
	cases := map[string]bool{
		`rethinkdb: Primary replica for shard ["", +inf) not available in: r.DB("lf").Table("e").Get("x")`: true,
		`rethinkdb: Cannot perform write: primary replica for shard ["", +inf) not available`:              true,
		`rethinkdb: Table ` + "`lf.e`" + ` does not exist`:                                                 false,
		`rethinkdb: connection closed`:                                                                     false,
	}
	for msg, want := range cases {
		if got := unavailable(errors.New(msg)); got != want {
			t.Errorf("unavailable(%q) = %v, want %v", msg, got, want)
		}
	}
}

func TestAmbiguous(t *testing.T) {
	const (
		db    = "Database `lf` is ambiguous; there are multiple databases with that name."
		table = "Table `lf.e` is ambiguous; there are multiple tables with that name."
	)
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"database", opFailed(db), true},
		{"table", opFailed(table), true},
		{"wrapped", fmt.Errorf("rethink: create: waiting for the table: %w", opFailed(table)), true},
		{"the words without the driver's type", errors.New("rethinkdb: " + table), false},
		{"missing", opFailed("Database `lf` does not exist."), false},
		{"another kind of name", opFailed("Server `s` is ambiguous; there are multiple servers with that name."), false},
		{"nil", nil, false},
	}
	for _, c := range cases {
		if got := ambiguous(c.err); got != c.want {
			t.Errorf("%s: ambiguous(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
	// opFailed builds the driver's error by hand: it must read as the
	// driver's does.
	if got := opFailed(db).Error(); got != "rethinkdb: "+db {
		t.Errorf("opFailed gives %q, want %q", got, "rethinkdb: "+db)
	}
}

// fakeServer is a catalog that behaves as RethinkDB 2.4.4 was measured to:
// dbCreate and tableCreate check the name and commit without serializing
// concurrent callers, so racing creators all succeed; every operation that
// names a database or table with duplicates (tableCreate, table.wait())
// fails as ambiguous, with the driver's error; drops go by id. gate, when
// set, holds every client at its first listing and after each name check
// until all n clients are there, which makes the race certain.
type fakeServer struct {
	mu     sync.Mutex
	dbs    map[string]string   // id -> name
	tables map[string]tableRow // id -> row
	made   []string            // ids created, in order
	gate   *barrier
	// lateDB, when set, receives the database id of the tableCreate of the
	// client with late set, held after its name check. The first
	// waitReady of any client commits it, just before it names the table,
	// and then closes lateDone, which every waitReady waits for: a create
	// call still in flight when another creator has converged.
	lateDB   chan string
	lateOnce sync.Once
	lateDone chan struct{}
	// onWait, when set, runs at every waitReady before it names the
	// table, to make duplicates land there.
	onWait func()
	// beforeDrop, when set, runs before a drop (outside the lock), to
	// simulate another process or a failure.
	beforeDrop func(id string) error
	// extraDB, when > 0, makes each listing add one more duplicate
	// database, that many times: a creator that never stops racing.
	extraDB int
}

func newFakeServer() *fakeServer {
	return &fakeServer{dbs: map[string]string{}, tables: map[string]tableRow{}}
}

func (f *fakeServer) newID() string {
	id := fmt.Sprintf("%08x-%04x", rand.Uint32(), rand.Uint32()&0xffff)
	f.made = append(f.made, id)
	return id
}

func (f *fakeServer) addDB(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID()
	f.dbs[id] = name
	return id
}

func (f *fakeServer) addTable(dbID, name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.newID()
	f.tables[id] = tableRow{ID: id, Name: name, DB: dbID, PrimaryKey: "id", Durability: "hard", WriteAcks: []byte(`"majority"`)}
	return id
}

// dbIDs returns the ids of the databases named name. Call with mu held.
func (f *fakeServer) dbIDs(name string) []string {
	var ids []string
	for id, n := range f.dbs {
		if n == name {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// count returns how many databases named db and tables named table in them
// there are.
func (f *fakeServer) count(db, table string) (dbs, tables int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := f.dbIDs(db)
	for _, t := range f.tables {
		if t.Name == table && slices.Contains(ids, t.DB) {
			tables++
		}
	}
	return len(ids), tables
}

// barrier holds callers until n of them wait, then lets them all go.
type barrier struct {
	mu    sync.Mutex
	n     int
	count int
	ch    chan struct{}
}

func (b *barrier) wait(ctx context.Context) error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	ch := b.ch
	b.count++
	if b.count == b.n {
		close(ch)
		b.ch, b.count = nil, 0
	}
	b.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fakeClient is one process's view of a fakeServer.
type fakeClient struct {
	f         *fakeServer
	db, table string
	listed    bool
	late      bool // see fakeServer.lateDB
}

func (c *fakeClient) list(ctx context.Context) ([]dbRow, []tableRow, error) {
	if !c.listed {
		c.listed = true
		if err := c.f.gate.wait(ctx); err != nil {
			return nil, nil, err
		}
	}
	f := c.f
	if f.extraDB > 0 {
		f.extraDB--
		f.addDB(c.db)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var dbs []dbRow
	for _, id := range f.dbIDs(c.db) {
		dbs = append(dbs, dbRow{ID: id, Name: c.db})
	}
	var tables []tableRow
	for _, t := range f.tables {
		if f.dbs[t.DB] == c.db {
			tables = append(tables, t)
		}
	}
	return dbs, tables, nil
}

func (c *fakeClient) createDB(ctx context.Context) error {
	f := c.f
	f.mu.Lock()
	exists := len(f.dbIDs(c.db)) > 0
	f.mu.Unlock()
	if exists {
		return nil // "already exists"
	}
	if err := f.gate.wait(ctx); err != nil {
		return err
	}
	f.addDB(c.db)
	return nil
}

func (c *fakeClient) createTable(ctx context.Context) error {
	f := c.f
	f.mu.Lock()
	ids := f.dbIDs(c.db)
	exists := false
	for _, t := range f.tables {
		exists = exists || (len(ids) == 1 && t.DB == ids[0] && t.Name == c.table)
	}
	f.mu.Unlock()
	if err := nameError(c.db, len(ids)); err != nil {
		return err
	}
	if exists {
		return nil
	}
	if err := f.gate.wait(ctx); err != nil {
		return err
	}
	// The commit resolves the database name again, as the server does.
	f.mu.Lock()
	ids = f.dbIDs(c.db)
	f.mu.Unlock()
	if err := nameError(c.db, len(ids)); err != nil {
		return err
	}
	if !c.late {
		f.addTable(ids[0], c.table)
		return nil
	}
	select {
	case f.lateDB <- ids[0]:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-f.lateDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *fakeClient) waitReady(ctx context.Context) error {
	f := c.f
	if f.onWait != nil {
		f.onWait()
	}
	if f.lateDB == nil {
		return c.resolveTable()
	}
	var err error
	first := false
	f.lateOnce.Do(func() {
		// The late table lands and this wait names the table before the
		// late creator goes on (and drops a duplicate).
		first = true
		defer close(f.lateDone)
		select {
		case id := <-f.lateDB:
			f.addTable(id, c.table)
			err = c.resolveTable()
		case <-ctx.Done():
			err = ctx.Err()
		}
	})
	if first {
		return err
	}
	return c.resolveTable()
}

// resolveTable is the server's answer to a query naming the table: nil when
// there is one database and one table of the names.
func (c *fakeClient) resolveTable() error {
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := f.dbIDs(c.db)
	if err := nameError(c.db, len(ids)); err != nil {
		return err
	}
	n := 0
	for _, t := range f.tables {
		if t.DB == ids[0] && t.Name == c.table {
			n++
		}
	}
	switch {
	case n == 0:
		return opFailed(fmt.Sprintf("Table `%s.%s` does not exist.", c.db, c.table))
	case n > 1:
		return opFailed(fmt.Sprintf("Table `%s.%s` is ambiguous; there are multiple tables with that name.", c.db, c.table))
	}
	return nil
}

// nameError is the server's answer to a query naming a database of which
// there are n.
func nameError(db string, n int) error {
	switch {
	case n == 0:
		return opFailed(fmt.Sprintf("Database `%s` does not exist.", db))
	case n > 1:
		return opFailed(fmt.Sprintf("Database `%s` is ambiguous; there are multiple databases with that name.", db))
	}
	return nil
}

// opFailed returns the error the driver makes of a server's OP_FAILED
// answer with the message msg, as RethinkDB 2.4 answers a name it cannot
// resolve. The driver builds it only inside its package; this sets the
// response it would have decoded.
func opFailed(msg string) error {
	var e r.RQLOpFailedError
	f := reflect.ValueOf(&e).Elem().FieldByName("response")
	raw, _ := json.Marshal(msg)
	resp := &r.Response{Responses: []json.RawMessage{raw}}
	reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Set(reflect.ValueOf(resp))
	return e
}

func (c *fakeClient) drop(id string, isDB bool) (dropOutcome, error) {
	f := c.f
	if f.beforeDrop != nil {
		if err := f.beforeDrop(id); err != nil {
			return classifyDrop(deleteResult{}, err), err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if isDB {
		if _, ok := f.dbs[id]; !ok {
			return classifyDrop(deleteResult{Skipped: 1}, nil), nil
		}
		delete(f.dbs, id)
		for tid, t := range f.tables {
			if t.DB == id {
				delete(f.tables, tid)
			}
		}
		return classifyDrop(deleteResult{Deleted: 1}, nil), nil
	}
	if _, ok := f.tables[id]; !ok {
		return classifyDrop(deleteResult{Skipped: 1}, nil), nil
	}
	delete(f.tables, id)
	return classifyDrop(deleteResult{Deleted: 1}, nil), nil
}

func (c *fakeClient) dropDB(_ context.Context, id string) (dropOutcome, error) {
	return c.drop(id, true)
}

func (c *fakeClient) dropTable(_ context.Context, id string) (dropOutcome, error) {
	return c.drop(id, false)
}

// logRecorder keeps the messages and "id" attributes logged.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	id := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "id" {
			id = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, rec.Message+" "+id)
	return nil
}

func (l *logRecorder) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestConvergeRace is the race measured on RethinkDB 2.4.4: n creators on
// a server without the database. The fake lets them all create the
// database, then all create the table; the last creator's table lands
// while the first to converge waits for its table by name, which the
// server answers as ambiguous (issue 30). Every creator must succeed and
// agree on the table, and one database and one table must be left.
func TestConvergeRace(t *testing.T) {
	const n = 6
	f := newFakeServer()
	f.gate = &barrier{n: n}
	f.lateDB, f.lateDone = make(chan string), make(chan struct{})
	rec := &logRecorder{}
	log := slog.New(rec)
	ctx := testCtx(t)
	rows := make([]tableRow, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		c := &fakeClient{f: f, db: "lf", table: "elections", late: i == n-1}
		wg.Go(func() { rows[i], errs[i] = settle(ctx, c, log, "lf", "elections", true) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("creator %d: %v", i, err)
		}
	}
	if dbs, tables := f.count("lf", "elections"); dbs != 1 || tables != 1 {
		t.Fatalf("after the race: %d databases and %d tables, want 1 and 1", dbs, tables)
	}
	// The race did make duplicates (n databases, then n tables), and each
	// was dropped by exactly one creator.
	if len(f.made) != 2*n {
		t.Fatalf("the fake made %d databases and tables, want %d: the race did not happen", len(f.made), 2*n)
	}
	if got := rec.count("rethink: duplicate database dropped"); got != n-1 {
		t.Errorf("%d duplicate databases logged as dropped, want %d", got, n-1)
	}
	if got := rec.count("rethink: duplicate table dropped"); got != n-1 {
		t.Errorf("%d duplicate tables logged as dropped, want %d", got, n-1)
	}
	// The lowest id of each kind was kept.
	dbIDs, tableIDs := slices.Clone(f.made[:n]), slices.Clone(f.made[n:])
	f.mu.Lock()
	kept := f.dbIDs("lf")[0]
	var keptTable string
	for id := range f.tables {
		keptTable = id
	}
	f.mu.Unlock()
	if kept != slices.Min(dbIDs) || keptTable != slices.Min(tableIDs) {
		t.Errorf("kept database %s and table %s, want the lowest ids %s and %s", kept, keptTable, slices.Min(dbIDs), slices.Min(tableIDs))
	}
	// The creators need not all return the kept table: a creator's
	// tableCreate may land after another has settled, and the table that
	// one returned is dropped a moment later if the new one has a lower id
	// (Create's documentation says why that is safe). settle narrows that
	// window by listing again after the wait; it cannot close it.
	agree := 0
	for _, row := range rows {
		if row.ID == keptTable {
			agree++
		}
	}
	t.Logf("%d of %d creators returned the kept table", agree, n)
}

// TestSettleLateDuplicate: a duplicate database or table that lands after
// the listing makes the wait by name ambiguous; settle lists, drops it and
// returns the table that is left. One that lands at every wait ends settle
// with an error of its own, never the server's "ambiguous".
func TestSettleLateDuplicate(t *testing.T) {
	for _, kind := range []string{"database", "table"} {
		t.Run(kind, func(t *testing.T) {
			f := newFakeServer()
			dbID := f.addDB("lf")
			keep := f.addTable(dbID, "elections")
			once := sync.OnceFunc(func() {
				if kind == "database" {
					f.addDB("lf")
				} else {
					f.addTable(dbID, "elections")
				}
			})
			f.onWait = once
			rec := &logRecorder{}
			row, err := settle(testCtx(t), &fakeClient{f: f, db: "lf", table: "elections"}, slog.New(rec), "lf", "elections", true)
			if err != nil {
				t.Fatal(err)
			}
			if dbs, tables := f.count("lf", "elections"); dbs != 1 || tables != 1 {
				t.Fatalf("%d databases and %d tables, want 1 and 1", dbs, tables)
			}
			if len(f.made) != 3 {
				t.Fatalf("the fake made %v, want a late duplicate", f.made)
			}
			if got := rec.count("rethink: duplicate " + kind + " dropped"); got != 1 {
				t.Errorf("logged %q, want one %s dropped", rec.msgs, kind)
			}
			if kind == "database" && row.ID != keep {
				t.Errorf("returned table %s, want %s: the database holding it is kept", row.ID, keep)
			}
		})
	}
	t.Run("at every wait", func(t *testing.T) {
		f := newFakeServer()
		dbID := f.addDB("lf")
		f.addTable(dbID, "elections")
		f.onWait = func() { f.addTable(dbID, "elections") }
		_, err := settle(testCtx(t), &fakeClient{f: f, db: "lf", table: "elections"}, slog.New(slog.DiscardHandler), "lf", "elections", true)
		if err == nil || ambiguous(err) || !strings.Contains(err.Error(), "kept appearing") {
			t.Fatalf("got %v, want an error after %d listings, not the server's answer", err, maxCreateRounds)
		}
	})
}

// TestConvergeHeal: a deployment broken by an earlier race (duplicate
// databases, one of them with duplicate tables) heals on the next Create,
// with creating allowed or not.
func TestConvergeHeal(t *testing.T) {
	for _, create := range []bool{true, false} {
		t.Run(fmt.Sprintf("create=%v", create), func(t *testing.T) {
			f := newFakeServer()
			full := f.addDB("lf")
			f.addDB("lf")
			f.addDB("lf")
			t1 := f.addTable(full, "elections")
			t2 := f.addTable(full, "elections")
			f.addTable(full, "users") // the application's: stays
			rec := &logRecorder{}
			row, err := converge(testCtx(t), &fakeClient{f: f, db: "lf", table: "elections"}, slog.New(rec), "lf", "elections", create)
			if err != nil {
				t.Fatal(err)
			}
			if row.ID != min(t1, t2) {
				t.Errorf("kept table %s, want the lowest id of %s and %s", row.ID, t1, t2)
			}
			if dbs, tables := f.count("lf", "elections"); dbs != 1 || tables != 1 {
				t.Fatalf("after healing: %d databases and %d tables, want 1 and 1", dbs, tables)
			}
			if _, users := f.count("lf", "users"); users != 1 {
				t.Fatalf("the application's table was dropped")
			}
			if rec.count("rethink: duplicate database dropped") != 2 || rec.count("rethink: duplicate table dropped") != 1 {
				t.Errorf("logged %q, want 2 databases and 1 table dropped", rec.msgs)
			}
		})
	}
}

// TestConvergeDropFailures: a duplicate that another process drops first is
// fine; any other failed drop ends Create with the error, and the next
// Create finishes the job.
func TestConvergeDropFailures(t *testing.T) {
	t.Run("dropped by another process first", func(t *testing.T) {
		f := newFakeServer()
		a := f.addDB("lf")
		f.addDB("lf")
		f.addDB("lf")
		f.beforeDrop = func(id string) error {
			// The other process wins every drop.
			f.mu.Lock()
			delete(f.dbs, id)
			f.mu.Unlock()
			return nil
		}
		f.addTable(a, "elections")
		rec := &logRecorder{}
		if _, err := converge(testCtx(t), &fakeClient{f: f, db: "lf", table: "elections"}, slog.New(rec), "lf", "elections", true); err != nil {
			t.Fatal(err)
		}
		if dbs, tables := f.count("lf", "elections"); dbs != 1 || tables != 1 {
			t.Fatalf("%d databases and %d tables, want 1 and 1", dbs, tables)
		}
		if n := rec.count("rethink: duplicate already dropped"); n != 2 {
			t.Errorf("logged %q, want 2 drops done by another process", rec.msgs)
		}
	})
	t.Run("failure", func(t *testing.T) {
		f := newFakeServer()
		f.addDB("lf")
		f.addDB("lf")
		cause := errors.New("rethinkdb: connection closed")
		f.beforeDrop = func(string) error { return cause }
		c := &fakeClient{f: f, db: "lf", table: "elections"}
		_, err := converge(testCtx(t), c, slog.New(slog.DiscardHandler), "lf", "elections", true)
		if !errors.Is(err, cause) || !strings.HasPrefix(err.Error(), "rethink: ") || errors.Is(err, base.ErrInvalidConfig) {
			t.Fatalf("got %v, want the drop's error, prefixed, not a configuration error", err)
		}
		f.beforeDrop = nil
		if _, err := converge(testCtx(t), c, slog.New(slog.DiscardHandler), "lf", "elections", true); err != nil {
			t.Fatalf("the next Create: %v", err)
		}
		if dbs, tables := f.count("lf", "elections"); dbs != 1 || tables != 1 {
			t.Fatalf("%d databases and %d tables, want 1 and 1", dbs, tables)
		}
	})
}

func TestConvergeRefusals(t *testing.T) {
	t.Run("missing with NoCreate", func(t *testing.T) {
		f := newFakeServer()
		_, err := converge(testCtx(t), &fakeClient{f: f, db: "lf", table: "elections"}, slog.New(slog.DiscardHandler), "lf", "elections", false)
		if !errors.Is(err, base.ErrInvalidConfig) || !strings.Contains(err.Error(), "database lf") || len(f.made) != 0 {
			t.Fatalf("got %v (made %v), want ErrInvalidConfig naming the database and nothing created", err, f.made)
		}
	})
	t.Run("duplicate holding the application's tables", func(t *testing.T) {
		f := newFakeServer()
		a, b := f.addDB("lf"), f.addDB("lf")
		f.addTable(a, "users")
		f.addTable(b, "jobs")
		_, err := converge(testCtx(t), &fakeClient{f: f, db: "lf", table: "elections"}, slog.New(slog.DiscardHandler), "lf", "elections", true)
		if !errors.Is(err, base.ErrInvalidConfig) || !strings.Contains(err.Error(), "by hand") {
			t.Fatalf("got %v, want ErrInvalidConfig asking for a hand fix", err)
		}
		if dbs, _ := f.count("lf", ""); dbs != 2 {
			t.Fatalf("%d databases left, want both: nothing may be dropped", dbs)
		}
	})
	t.Run("never converges", func(t *testing.T) {
		f := newFakeServer()
		f.extraDB = 10 * maxCreateRounds
		_, err := converge(testCtx(t), &fakeClient{f: f, db: "lf", table: "elections"}, slog.New(slog.DiscardHandler), "lf", "elections", true)
		if err == nil || !strings.Contains(err.Error(), "rounds") {
			t.Fatalf("got %v, want an error after %d rounds", err, maxCreateRounds)
		}
	})
}
