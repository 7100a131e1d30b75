package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// spyNotice is what the trigger function raises, once a test has made it
// a spy (spyTrigger), each time it runs.
const spyNotice = "leaderfeed trigger ran"

// spyTrigger replaces the trigger function of the Store's election table
// with one that raises spyNotice and then does what the real one does.
func spyTrigger(t *testing.T, pool *pgxpool.Pool, s *Store) {
	t.Helper()
	body := strings.Replace(recordFunctionBody, "BEGIN\n", "BEGIN\n  RAISE NOTICE '"+spyNotice+"';\n", 1)
	if body == recordFunctionBody {
		t.Fatal("the trigger function has no BEGIN line to put the spy after")
	}
	mustExec(t, pool, createFunction(s.ddl.recordFunc, body))
}

// notices collects the notices the connections of a pool receive.
type notices struct {
	mu sync.Mutex
	n  int
}

func (n *notices) take() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.n
	n.n = 0
	return c
}

// onePool returns a pool of one connection, so that every statement of
// the test runs on the same server session, and counts the spy's notices
// on it.
func onePool(t *testing.T, cfg *pgxpool.Config) (*pgxpool.Pool, *notices) {
	t.Helper()
	cfg.MaxConns = 1
	n := &notices{}
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, notice *pgconn.Notice) {
		if notice.Message == spyNotice {
			n.mu.Lock()
			n.n++
			n.mu.Unlock()
		}
	}
	pool, err := pgxpool.NewWithConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, n
}

// rawListener is a bare LISTEN connection on a channel: it sees every
// notification the server delivers, duplicates included.
type rawListener struct {
	t       *testing.T
	conn    *pgx.Conn
	channel string
	marks   int
}

func listenRaw(t *testing.T, channel string) *rawListener {
	t.Helper()
	conn, err := pgx.Connect(ctxT(t), serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeConn(conn) })
	if _, err := conn.Exec(ctxT(t), "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return &rawListener{t: t, conn: conn, channel: channel}
}

// since returns the payloads delivered since the last call: it sends a
// mark from a transaction of its own and reads up to it, which comes after
// every notification of a transaction committed before.
func (l *rawListener) since(pool *pgxpool.Pool) []string {
	l.t.Helper()
	l.marks++
	mark := fmt.Sprintf("mark %d", l.marks)
	mustExec(l.t, pool, "SELECT pg_notify($1, $2)", l.channel, mark)
	var out []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		n, err := l.conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			l.t.Fatalf("waiting for %q: %v", mark, err)
		}
		if n.Payload == mark {
			return out
		}
		out = append(out, n.Payload)
	}
}

// records decodes the records of the payloads (each a notification of
// records, as the trigger function sends them).
func records(t *testing.T, payloads []string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, p := range payloads {
		var n struct {
			K  string           `json:"k"`
			Rs []map[string]any `json:"rs"`
		}
		if err := json.Unmarshal([]byte(p), &n); err != nil || n.K != "b" {
			t.Fatalf("payload %q: not a notification of records (%v)", p, err)
		}
		out = append(out, n.Rs...)
	}
	return out
}

// TestWritesAnnounceThemselves checks that the Store's single writes send
// their own notification and skip the trigger, while every other write on
// the table, on the same pooled connection right after them, is still
// announced by the trigger; and that an announcement is sent only when its
// write commits.
func TestWritesAnnounceThemselves(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pool, spied := onePool(t, cfg)
	opts := Options{Table: uniqueName(t)}
	opts.ChannelPrefix = "lf_own_" + opts.Table[len(opts.Table)-8:]
	s := openStore(t, pool, opts)
	spyTrigger(t, pool, s)
	table := s.ddl.table
	raw := listenRaw(t, opts.ChannelPrefix)
	feed := sub(t, s)
	ctx := ctxT(t)

	// wantOwn checks that r was announced once, by its own statement.
	wantOwn := func(what string, r heartbeat.Record) {
		t.Helper()
		if n := spied.take(); n != 0 {
			t.Fatalf("%s: the trigger function ran %d times, want none", what, n)
		}
		rs := records(t, raw.since(pool))
		if len(rs) != 1 || rs[0]["e"] != r.Election || rs[0]["r"] != float64(r.Revision) {
			t.Fatalf("%s: records announced %v, want revision %d of %q once", what, rs, r.Revision, r.Election)
		}
		if n := recv(t, feed); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
			t.Fatalf("%s: feed got %v %+v, want %+v", what, n.Type, n.Record, r)
		}
	}
	// wantForeign checks that a write that is not the Store's ran the
	// trigger and was announced.
	wantForeign := func(what string, op string) backend.Notification {
		t.Helper()
		if n := spied.take(); n != 1 {
			t.Fatalf("%s: the trigger function ran %d times, want once", what, n)
		}
		rs := records(t, raw.since(pool))
		if len(rs) != 1 || rs[0]["op"] != op {
			t.Fatalf("%s: records announced %v, want one of op %s", what, rs, op)
		}
		return recv(t, feed)
	}

	claim, err := s.Heartbeat(ctx, heartbeat.Record{}, heartbeat.Record{Election: "e", Leader: "a", Term: 1, Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	wantOwn("claim (INSERT)", claim)
	renewed, err := s.Heartbeat(ctx, claim, heartbeat.Record{Election: "e", Leader: "a", Term: 1, Value: []byte("w")})
	if err != nil {
		t.Fatal(err)
	}
	wantOwn("renewal (UPDATE)", renewed)

	// The setting ends with the write's transaction: the operator's
	// statements on the same connection still run the trigger.
	var setting *string
	if err := pool.QueryRow(ctx, "SELECT current_setting($1, true)", notifiedSetting).Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != nil && *setting == "on" {
		t.Fatalf("%s is %q after the write's transaction", notifiedSetting, *setting)
	}
	mustExec(t, pool, "UPDATE "+table+" SET leader = 'op', revision = revision + 1 WHERE election = 'e'")
	if n := wantForeign("an operator's UPDATE", "U"); n.Type != backend.RecordChanged || n.Record.Leader != "op" || n.Record.Revision != renewed.Revision+1 {
		t.Fatalf("feed got %v %+v after the operator's UPDATE", n.Type, n.Record)
	}
	mustExec(t, pool, "INSERT INTO "+table+" (election, leader, term, revision) VALUES ('f', 'op', 1, 1)")
	if n := wantForeign("an operator's INSERT", "I"); n.Type != backend.RecordChanged || n.Record.Election != "f" {
		t.Fatalf("feed got %v %+v after the operator's INSERT", n.Type, n.Record)
	}
	mustExec(t, pool, "DELETE FROM "+table+" WHERE election = 'f'")
	if n := wantForeign("an operator's DELETE", "D"); n.Type != backend.RecordDeleted || n.Election != "f" {
		t.Fatalf("feed got %v %q after the operator's DELETE", n.Type, n.Election)
	}

	// Presence records are never announced, and their statements do not
	// run the trigger function either.
	if err := s.Present(ctx, "e", backend.Presence{Node: "a", CanLead: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.Present(ctx, "e", backend.Presence{Node: "a", CanLead: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.Absent(ctx, "e", "a"); err != nil {
		t.Fatal(err)
	}
	if n := spied.take(); n != 0 {
		t.Fatalf("presence: the trigger function ran %d times, want none", n)
	}
	if got := raw.since(pool); len(got) != 0 {
		t.Fatalf("presence announced %q", got)
	}

	// A refused write writes and announces nothing (its trigger runs and
	// finds no row), and the next write of the operator is announced.
	if _, err := s.Heartbeat(ctx, renewed, heartbeat.Record{Election: "e", Leader: "a", Term: 1}); err == nil {
		t.Fatal("a write on a stale revision succeeded")
	}
	spied.take()
	if got := raw.since(pool); len(got) != 0 {
		t.Fatalf("a refused write announced %q", got)
	}
	cur, err := s.Get(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}

	// The Store's statement in a transaction that rolls back announces
	// nothing; the same connection's next transaction runs the trigger.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, s.updateSQL, "e", "b", int64(2), []byte{}, int64(0), int64(cur.Revision), cur.Leader, int64(cur.Term), "", int64(0), int64(0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := raw.since(pool); len(got) != 0 || spied.take() != 0 {
		t.Fatalf("a rolled-back write announced %q", got)
	}
	mustExec(t, pool, "UPDATE "+table+" SET leader = 'op2', revision = revision + 1 WHERE election = 'e'")
	if n := wantForeign("an operator's UPDATE after a rollback", "U"); n.Record.Leader != "op2" {
		t.Fatalf("feed got %v %+v", n.Type, n.Record)
	}

	// A role with only the documented grants announces its own writes
	// too: setting a custom parameter needs no privilege.
	rcfg := rolePool(t, pool, "GRANT SELECT, INSERT, UPDATE, DELETE ON "+table+" TO %s").Config()
	rpool, rspied := onePool(t, rcfg)
	rs, err := NewStore(rpool, Options{Table: opts.Table, ChannelPrefix: opts.ChannelPrefix, NoCreate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	if err := rs.Create(ctx); err != nil {
		t.Fatal(err)
	}
	cur, err = rs.Get(ctx, "e")
	if err != nil {
		t.Fatal(err)
	}
	r, err := rs.Heartbeat(ctx, cur, heartbeat.Record{Election: "e", Leader: "c", Term: cur.Term + 1})
	if err != nil {
		t.Fatal(err)
	}
	if n := rspied.take(); n != 0 {
		t.Fatalf("the least-privileged role's write ran the trigger function %d times", n)
	}
	wantOwn("the least-privileged role's claim", r)
}

// TestAnnouncementFitsAndMatchesTrigger checks the largest valid record
// (names full of characters JSON escapes, the largest value, lease,
// handover token and incarnation, the longest schema and table; a
// successor names no leader and carries no value) in one notification,
// decoded whole, and that the Store's own announcement is the trigger's
// byte for byte: on a table whose triggers are of a version before
// skipWhen both are sent, and the server delivers one.
func TestAnnouncementFitsAndMatchesTrigger(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := ctxT(t)
	long := strings.Repeat
	unique := uniqueName(t)
	unique = unique[len(unique)-8:]
	opts := Options{Schema: "s_" + unique + long("x", 53), Table: long("T", 63), ChannelPrefix: "lf_fit_" + unique}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{opts.Schema}.Sanitize()+" CASCADE")
	})
	s := openStore(t, pool, opts)
	// The triggers as versions before skipWhen made them.
	for i := range recordTriggers {
		mustExec(t, pool, s.ddl.dropRecordTrigger(opts.ChannelPrefix, i))
		mustExec(t, pool, strings.Replace(s.ddl.createRecordTrigger(opts.ChannelPrefix, i), " WHEN ("+skipWhen+")", "", 1))
	}
	raw := listenRaw(t, opts.ChannelPrefix)
	feed := sub(t, s)
	next := heartbeat.Record{Election: long(`"`, heartbeat.MaxNameLen), Leader: long(`\`, heartbeat.MaxNameLen), Term: 1 << 62,
		Value: bytes.Repeat([]byte{0xff}, heartbeat.MaxValueLen), Lease: heartbeat.MaxLease, Handover: heartbeat.MaxToken, Incarnation: heartbeat.MaxToken}
	r, err := s.Heartbeat(ctx, heartbeat.Record{}, next)
	if err != nil {
		t.Fatal(err)
	}
	got := raw.since(pool)
	if len(got) != 1 || len(got[0]) >= 8000 || strings.Contains(got[0], `"big"`) {
		t.Fatalf("the largest record was announced in %d notifications (%d bytes): want one whole record", len(got), len(got[0]))
	}
	if n := recv(t, feed); n.Type != backend.RecordChanged || !n.Record.Equal(r) {
		t.Fatalf("feed got %v %+v, want %+v", n.Type, n.Record, r)
	}
	r2, err := s.Heartbeat(ctx, r, heartbeat.Record{Election: r.Election, Leader: r.Leader, Term: r.Term})
	if err != nil {
		t.Fatal(err)
	}
	if got := raw.since(pool); len(got) != 1 {
		t.Fatalf("a renewal on the old triggers was delivered %d times, want once", len(got))
	}
	if n := recv(t, feed); !n.Record.Equal(r2) {
		t.Fatalf("feed got %v %+v, want %+v", n.Type, n.Record, r2)
	}

	// A NoCreate check accepts the old triggers; Create replaces them.
	checker, _ := NewStore(pool, Options{Schema: opts.Schema, Table: opts.Table, ChannelPrefix: opts.ChannelPrefix, NoCreate: true})
	defer checker.Close()
	if err := checker.Create(ctx); err != nil {
		t.Fatalf("NoCreate check on the old triggers: %v", err)
	}
	if err := s.Create(ctx); err != nil {
		t.Fatal(err)
	}
	for _, rt := range recordTriggers {
		def, err := triggerDef(ctx, pool, opts.Schema, opts.Table, opts.ChannelPrefix+rt.suffix)
		if err != nil || !strings.Contains(def, notifiedSetting) {
			t.Fatalf("trigger %s after Create: %q, %v", rt.suffix, def, err)
		}
	}
	if err := checker.Create(ctx); err != nil {
		t.Fatalf("NoCreate check after the upgrade: %v", err)
	}
	mustExec(t, pool, "UPDATE "+s.ddl.table+" SET leader = 'op', revision = revision + 1")
	if n := recv(t, feed); n.Record.Leader != "op" {
		t.Fatalf("an operator's UPDATE after the upgrade: feed got %v %+v", n.Type, n.Record)
	}
}
