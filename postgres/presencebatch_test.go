package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leaderfeed/leaderfeed/base"
	"github.com/leaderfeed/leaderfeed/base/backend"
	"github.com/leaderfeed/leaderfeed/heartbeat"
)

// queryCounter is a pgx tracer that counts the statements a pool sends.
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// countingPool returns a pool on the test server whose statements c counts.
func countingPool(t *testing.T, c *queryCounter) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestPresenceBatch checks the batched presence statements on the server:
// PresentBatch writes a thousand presence rows in one statement, as
// Present writes one (node id in leader, term and revision 0, the
// server's clock, joined at it, the incarnation), and a bad or repeated
// write fails alone;
// ParticipantsBatch reads the participants of many elections in one
// statement, each as Participants does, leaving out rows that do not
// decode.
func TestPresenceBatch(t *testing.T) {
	t.Parallel()
	var c queryCounter
	pool := countingPool(t, &c)
	opts := Options{Table: uniqueName(t)}
	table := pgx.Identifier{"public", opts.Table}.Sanitize()
	s := openStore(t, pool, opts)
	ctx := ctxT(t)
	const elections, nodes = 250, 4
	var writes []backend.PresenceWrite
	names := make([]string, elections)
	for i := range names {
		names[i] = fmt.Sprintf("e%03d", i)
		for n := range nodes {
			writes = append(writes, backend.PresenceWrite{Election: names[i],
				Presence: backend.Presence{Node: fmt.Sprintf("n%d", n), Value: []byte{byte(n)}, Priority: n, CanLead: n > 0, Token: uint64(i*nodes + n + 1),
					Incarnation: uint64(i*nodes + n)}})
		}
	}
	writes = append(writes,
		backend.PresenceWrite{Election: "e000", Presence: backend.Presence{Node: "n1"}},                 // named before
		backend.PresenceWrite{Election: "e000", Presence: backend.Presence{Node: "n9", Priority: 1000}}, // priority out of range
	)
	before := c.n.Load()
	errs, err := s.PresentBatch(ctx, writes)
	if stmts := c.n.Load() - before; stmts != 1 {
		t.Fatalf("PresentBatch of %d writes sent %d statements, want 1", len(writes), stmts)
	}
	if err != nil || len(errs) != len(writes) {
		t.Fatalf("PresentBatch: %d results, %v", len(errs), err)
	}
	for i, err := range errs[:elections*nodes] {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for _, err := range errs[elections*nodes:] {
		if !errors.Is(err, base.ErrInvalidConfig) || !errors.Is(err, heartbeat.ErrInvalidRecord) {
			t.Fatalf("bad write: %v, want ErrInvalidConfig and ErrInvalidRecord", err)
		}
	}
	var rows, odd int
	if err := pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE term <> 0 OR revision <> 0 OR leader <> split_part(election, chr(31), 2)"+
		" OR joined IS DISTINCT FROM ts OR incarnation <> $1 * substr(split_part(election, chr(31), 1), 2)::int + substr(leader, 2)::int)"+
		" FROM "+table, nodes).Scan(&rows, &odd); err != nil {
		t.Fatal(err)
	}
	if rows != elections*nodes || odd != 0 {
		t.Fatalf("%d presence rows (%d not as Present writes them), want %d", rows, odd, elections*nodes)
	}
	// A row that does not decode is left out, as Participants leaves it:
	// also one whose ts no time.Time holds.
	mustExec(t, pool, "INSERT INTO "+table+" (election, leader, term, revision, value) VALUES ($1, 'bad', 0, 0, 'not json')", backend.PresenceKey("e001", "bad"))
	mustExec(t, pool, "INSERT INTO "+table+" (election, leader, term, revision, ts, value) VALUES ($1, 'inf', 0, 0, 'infinity', $2)",
		backend.PresenceKey("e002", "inf"), []byte(`{"p":0,"c":true}`))

	before = c.n.Load()
	read := append(names[:0:0], names...)
	read = append(read, "none", "e000", "")
	res, err := s.ParticipantsBatch(ctx, read)
	if stmts := c.n.Load() - before; stmts != 1 {
		t.Fatalf("ParticipantsBatch of %d elections sent %d statements, want 1", len(read), stmts)
	}
	if err != nil || len(res) != len(read) {
		t.Fatalf("ParticipantsBatch: %d results, %v", len(res), err)
	}
	for i, e := range names[:3] {
		one, now, err := s.Participants(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		if res[i].Err != nil || res[i].Now.IsZero() || now.Before(res[i].Now) || len(res[i].Presences) != nodes || !sameNodes(one, res[i].Presences) {
			t.Fatalf("ParticipantsBatch, %s: %+v; Participants gives %+v", e, res[i], one)
		}
	}
	if r := res[elections]; r.Err != nil || len(r.Presences) != 0 || r.Now.IsZero() {
		t.Fatalf("ParticipantsBatch of an election without participants: %+v", r)
	}
	for _, r := range res[elections+1:] {
		if !errors.Is(r.Err, base.ErrInvalidConfig) {
			t.Fatalf("ParticipantsBatch of a repeated or empty name: %+v, want ErrInvalidConfig", r)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.PresentBatch(cctx, writes[:2]); !errors.Is(err, context.Canceled) {
		t.Fatalf("PresentBatch with a cancelled context: %v", err)
	}
}

// sameNodes reports whether a and b hold the same presences.
func sameNodes(a, b []backend.Presence) bool {
	m := map[string]backend.Presence{}
	for _, p := range a {
		m[p.Node] = p
	}
	for _, p := range b {
		q, ok := m[p.Node]
		if !ok || q.Priority != p.Priority || q.CanLead != p.CanLead || q.Token != p.Token || string(q.Value) != string(p.Value) || !q.Timestamp.Equal(p.Timestamp) ||
			q.Incarnation != p.Incarnation || !q.Joined.Equal(p.Joined) {
			return false
		}
	}
	return len(a) == len(b)
}

// checkOlderPresence checks the presence row of node in election that an
// older version wrote (no incarnation, no joined): it reads with
// Incarnation 0 and no Joined, a write of incarnation 0 keeps it so (the
// same incarnation keeps Joined, none here), and a write of another
// incarnation sets Joined to its timestamp.
func checkOlderPresence(t *testing.T, s *Store, election, node string) {
	t.Helper()
	ctx := ctxT(t)
	read := func() backend.Presence {
		t.Helper()
		ps, _, err := s.Participants(ctx, election)
		if err != nil {
			t.Fatalf("Participants: %v", err)
		}
		for _, p := range ps {
			if p.Node == node {
				return p
			}
		}
		t.Fatalf("Participants = %+v, want %s listed", ps, node)
		return backend.Presence{}
	}
	if p := read(); p.Incarnation != 0 || !p.Joined.IsZero() || !p.CanLead || p.Timestamp.IsZero() {
		t.Fatalf("an older version's presence reads %+v; want incarnation 0, no joined time", p)
	}
	if err := s.Present(ctx, election, backend.Presence{Node: node, CanLead: true}); err != nil {
		t.Fatal(err)
	}
	if p := read(); p.Incarnation != 0 || !p.Joined.IsZero() {
		t.Fatalf("after a write of incarnation 0 over an older version's presence: %+v; want no joined time kept", p)
	}
	if err := s.Present(ctx, election, backend.Presence{Node: node, CanLead: true, Incarnation: 7}); err != nil {
		t.Fatal(err)
	}
	if p := read(); p.Incarnation != 7 || !p.Joined.Equal(p.Timestamp) {
		t.Fatalf("after a write of incarnation 7 over an older version's presence: %+v; want it joined at its timestamp", p)
	}
}

// TestPresenceBatchOverlapping checks that processes refreshing
// overlapping presence rows in batches, in opposite orders, queue behind
// each other instead of deadlocking (the rows are written in key order).
func TestPresenceBatchOverlapping(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	opts := Options{Table: uniqueName(t)}
	const stores, elections, rounds = 4, 100, 10
	var wg sync.WaitGroup
	for n := range stores {
		s := openStore(t, pool, opts)
		wg.Go(func() {
			writes := make([]backend.PresenceWrite, elections)
			for i := range writes {
				j := i
				if n%2 == 1 {
					j = elections - 1 - i
				}
				writes[i] = backend.PresenceWrite{Election: fmt.Sprintf("e%03d", j), Presence: backend.Presence{Node: "shared", CanLead: true}}
			}
			for r := range rounds {
				if _, err := s.PresentBatch(ctxT(t), writes); err != nil {
					t.Errorf("store %d, round %d: %v", n, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
