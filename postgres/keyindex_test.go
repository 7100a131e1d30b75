package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base/backend"
)

// TestKeyIndex: the reads of an election's participants, alone and in a
// batch, are ranges of the key index whatever the collation of the
// election column, as the prepared statements pgx makes run them (a plan
// for any parameter): with the database's default collation other than C
// (en_US.UTF-8, what initdb usually gets), a prefix match on the primary
// key scanned the whole table on every read.
func TestKeyIndex(t *testing.T) {
	pool := newPool(t)
	ctx := ctxT(t)
	var coll string
	err := pool.QueryRow(ctx, `SELECT collname FROM pg_collation
		WHERE collname NOT IN ('C', 'POSIX', 'default', 'ucs_basic') AND collname NOT LIKE 'C.%' AND collencoding IN (-1, (SELECT encoding FROM pg_database WHERE datname = current_database()))
		ORDER BY collname = 'und-x-icu' DESC, collname = 'en_US.utf8' DESC, collname LIMIT 1`).Scan(&coll)
	if err != nil {
		t.Fatalf("no collation other than C on the server: %v", err)
	}
	opts := Options{Table: uniqueName(t), ChannelPrefix: "lf_keys"}
	quoted := pgx.Identifier{"public", opts.Table}.Sanitize()
	// The table as Create makes it, its keys in another collation.
	o, _ := opts.withDefaults()
	ddl := strings.Replace(newDDL(o).createTable(), "election text PRIMARY KEY", "election text COLLATE "+pgx.Identifier{coll}.Sanitize()+" PRIMARY KEY", 1)
	if ddl == newDDL(o).createTable() {
		t.Fatal("the election column's definition changed: update this test")
	}
	mustExec(t, pool, ddl)
	s := openStore(t, pool, opts)
	var exists bool
	if err := pool.QueryRow(ctx, "SELECT "+keyIndexExists("$1::text"), quoted).Scan(&exists); err != nil || !exists {
		t.Fatalf("the key index after Create: %v, %v", exists, err)
	}
	// Many elections' rows, so that a scan of the table costs more than
	// the index; each election's name a prefix of the next one's.
	mustExec(t, pool, "INSERT INTO "+quoted+" (election, leader, revision, value, incarnation, joined)"+
		" SELECT 'e' || g || chr(31) || 'n' || k, 'n' || k, 0, convert_to('{\"p\":0,\"c\":true}', 'UTF8'), 1, now() FROM generate_series(1, 3000) g, generate_series(1, 3) k")
	for _, n := range []string{"a", "b"} {
		if err := s.Present(ctx, "e1", backend.Presence{Node: n, CanLead: true, Incarnation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, pool, "ANALYZE "+quoted)

	ps, _, err := s.Participants(ctx, "e1")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, p := range ps {
		nodes = append(nodes, p.Node)
	}
	slices.Sort(nodes)
	if want := []string{"a", "b", "n1", "n2", "n3"}; !slices.Equal(nodes, want) {
		t.Fatalf("participants of e1: %v, want %v (not those of e10, e100, ...)", nodes, want)
	}
	res, err := s.ParticipantsBatch(ctx, []string{"e1", "e12", "e3000", "none"})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{5, 3, 3, 0} {
		if got := len(res[i].Presences); got != want || res[i].Err != nil {
			t.Fatalf("batch read, election %d: %d participants (%v), want %d", i, got, res[i].Err, want)
		}
	}

	conn := genericPlans(t, ctx, pool)
	for _, q := range []struct{ name, sql, typ, arg string }{
		{"Participants", s.participantsSQL, "text", "'e1'"},
		{"ParticipantsBatch", s.participantsBatchSQL, "text[]", "ARRAY['e1', 'e12']"},
	} {
		plan := genericPlan(t, ctx, conn, fmt.Sprintf("lf_%s(%s)", strings.ToLower(q.name), q.typ), q.sql, q.arg)
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Index Cond") {
			t.Errorf("%s on a table in collation %s, its generic plan scans the table:\n%s", q.name, coll, plan)
		}
	}
}

// genericPlan prepares sql as name (with its parameter types, if any) on
// conn (genericPlans) and returns the plan EXPLAIN gives for it with
// args.
func genericPlan(t *testing.T, ctx context.Context, conn *pgxpool.Conn, name, sql, args string) string {
	t.Helper()
	if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+sql); err != nil {
		t.Fatal(err)
	}
	if i := strings.IndexByte(name, '('); i >= 0 {
		name = name[:i]
	}
	rows, err := conn.Query(ctx, "EXPLAIN EXECUTE "+name+"("+args+")", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// genericPlans returns a connection of pool that plans every prepared
// statement generically, as the statements pgx prepares and caches come
// to be planned; reset and released at cleanup.
func genericPlans(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *pgxpool.Conn {
	t.Helper()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "RESET plan_cache_mode; DEALLOCATE ALL") })
	return conn
}
